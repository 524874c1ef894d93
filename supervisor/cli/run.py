"""`ccsup run`: one turn from the shell: wait for a slot, stream its output, exit with its status.

Ctrl-C cancels the turn and waits for its end; a second Ctrl-C stops waiting (exit 130).
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING

import click

from .options import key_option
from .output import OutputFollower
from .where import emit_json, where

if TYPE_CHECKING:
    from ..client import Client

WAIT_NOTICE = 0.25  # seconds a turn waits before `ccsup run` says so


def env_option(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> dict[str, str]:
    env = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not name:
            raise click.BadParameter(
                f"{item!r}: write NAME=VALUE, or NAME to pass this shell's value"
            )
        if not sep:
            if name not in os.environ:
                raise click.BadParameter(f"{name!r} has no value here; write {name}=VALUE")
            value = os.environ[name]
        env[name] = value
    return env


def turn_exit_status(exited: dict | None) -> int:
    """`ccsup run`'s status from a turn's `exited` event: CMD's code, 128+signal, 125 guard lost."""
    if exited is None:
        return 125
    if exited.get("reason") == "guard_lost":
        return 125
    if exited.get("signal"):
        return 128 + int(exited["signal"])
    code = exited.get("code")
    return int(code) if isinstance(code, int) else 125


@click.command(context_settings={"allow_interspersed_args": False})
@click.option(
    "--key", required=True, callback=key_option, help="The cap key, e.g. codex or opencode:xai."
)
@click.option("--session", help="The holder's session label.")
@click.option("--agent", help="The holder's agent label.")
@click.option(
    "--cwd", type=click.Path(file_okay=False), help="Working directory (default: this one)."
)
@click.option(
    "--env",
    "env",
    multiple=True,
    callback=env_option,
    metavar="NAME=VALUE",
    help="Set a variable for the command (repeatable); NAME alone passes this shell's value.",
)
@click.option(
    "--wait-timeout",
    type=click.FloatRange(min=0, min_open=True),
    help="Give up after waiting this many seconds for a slot.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the turn's events as JSON lines instead of its output.",
)
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_context
def run(
    ctx: click.Context,
    key: str,
    session: str | None,
    agent: str | None,
    cwd: str | None,
    env: dict[str, str],
    wait_timeout: float | None,
    as_json: bool,
    cmd: tuple[str, ...],
) -> None:
    """Run CMD as one turn of KEY: wait for a slot, stream its output, exit with its status."""
    import uuid

    from guardd.procs import start_ticks

    holder: dict[str, int | str | None] = {"pid": os.getpid(), "start": start_ticks(os.getpid())}
    if session:
        holder["session"] = session
    if agent:
        holder["agent"] = agent
    turn_id = uuid.uuid4().hex
    with where(ctx).client() as client, client.subscribe([f"turn.{turn_id}."]) as sub:
        runner = _TurnRunner(client, turn_id, key, as_json)
        with _sigint_queued() as interrupts:
            reply = client.turn(
                key,
                list(cmd),
                id=turn_id,
                cwd=os.path.abspath(cwd or os.getcwd()),
                env=env or None,
                holder=holder,
                wait_timeout=wait_timeout,
            )
            if reply.get("state") == "queued":
                runner.waiting(reply.get("position"))
            code = runner.follow(sub, interrupts)
    ctx.exit(code)


class _sigint_queued:
    """While inside: SIGINT only counts (the follow loop acts on it), as trio's handlers do."""

    def __enter__(self) -> list[int]:
        import signal

        self.count: list[int] = []
        self._old = signal.signal(signal.SIGINT, lambda signum, frame: self.count.append(signum))
        return self.count

    def __exit__(self, *exc) -> None:
        import signal

        signal.signal(signal.SIGINT, self._old)


class _TurnRunner:
    """Follows one turn's events for `ccsup run` and works out its exit status."""

    def __init__(self, client: Client, turn_id: str, key: str, as_json: bool):
        self.client = client
        self.turn_id = turn_id
        self.key = key
        self.as_json = as_json
        self.exited: dict | None = None
        self._shown_position = None
        self._waiting: tuple | None = None
        self.granted = False
        paths = client.paths
        self.outputs = {
            stream: OutputFollower(paths.output_log(turn_id, stream), getattr(sys, stream).buffer)
            for stream in ("stdout", "stderr")
        }

    def waiting(self, position) -> None:
        """Note that the turn waits; said on stderr only if it still waits WAIT_NOTICE s later
        (every turn passes through `queued`, and a free slot grants it at once)."""
        if not self.granted:
            self._waiting = (position, time.monotonic())

    def _show_waiting(self) -> None:
        if self._waiting is None or self.granted or self.as_json:
            return
        position, since = self._waiting
        if position == self._shown_position or time.monotonic() - since < WAIT_NOTICE:
            return
        self._shown_position = position
        where = f" (position {position})" if position is not None else ""
        click.echo(f"ccsup: waiting for a slot of {self.key}{where}", err=True)

    def follow(self, sub, interrupts: list[int]) -> int:
        from ..client import RemoteError

        cancel_sent = False
        quiet_since = time.monotonic()
        while True:
            if interrupts and not cancel_sent:
                cancel_sent = True
                click.echo(
                    f"ccsup: cancelling turn {self.turn_id} (Ctrl-C again to stop waiting)",
                    err=True,
                )
                try:
                    self.client.cancel(self.turn_id)
                except RemoteError as e:
                    click.echo(
                        f"ccsup: unable to cancel turn {self.turn_id}: {e.message}", err=True
                    )
            if len(interrupts) >= 2:
                click.echo(
                    f"ccsup: turn {self.turn_id} is still being stopped; not waiting for it",
                    err=True,
                )
                return 130
            event = sub.recv(0.1)
            self._show_waiting()
            if event is None:
                if time.monotonic() - quiet_since > 1.0:
                    self.client.check_running()  # NotRunning ends the wait: no terminal event will come
                    quiet_since = time.monotonic()
                continue
            quiet_since = time.monotonic()
            done = self.on_event(*event)
            if done is not None:
                return done

    def on_event(self, topic: str, body: dict) -> int | None:
        from ..subscription import is_terminal

        kind = topic.rsplit(".", 1)[-1]
        if self.as_json:
            emit_json({"topic": topic, "body": body})
        if kind in ("stdout", "stderr"):
            if not self.as_json:
                self.outputs[kind].on_event(body)
        elif kind == "queued":
            self.waiting(body.get("position"))
        elif kind in ("granted", "started"):
            self.granted = True
        elif kind == "exited":
            self.exited = body
        if not is_terminal(topic):
            return None
        if not self.as_json:
            for follower in self.outputs.values():
                follower.drain()
                follower.close()
        if kind == "released":
            if self.exited is None and not self.as_json:
                click.echo(
                    f"ccsup: turn {self.turn_id} was released without an exit status", err=True
                )
            return turn_exit_status(self.exited)
        if not self.as_json:
            click.echo(
                f"ccsup: turn {self.turn_id} {kind}: {body.get('reason') or 'no reason given'}",
                err=True,
            )
        return 1
