"""`ccsup run`: one turn from the shell: wait for a slot, stream its output, exit with its status.

Without --key: $CCSUP_KEY, else `default`. The turn gets this process's environment (sent whole,
`env_replace`; the supervisor keeps it only in its 0600 queue while the turn waits) and cwd, as
any wrapper (timeout, nice, flock) passes them; --clean-env gives the supervisor's environment
with only --env added. Its stdin is forwarded to the turn once it started, end
of input included (supervisor.cli.run.stdin_forward). Exit codes a script can tell apart are
supervisor.cli.run.exits's (124 timeout, 75 wait timeout, 130 Ctrl-C, 69 cancelled by someone else, 65
rejected, 125 guard lost, 71 supervisor lost). Ctrl-C cancels the turn and waits for its end; a
second Ctrl-C stops waiting (exit 130).

A supervisor that dies while the turn runs is ridden through (supervisor.client.ride_through):
`ccsup run` waits up to its adopt_within (+ 5 s) for one to answer, follows the turn there and
prints its output from the logs by offset, each byte once; 71 when none came back. A turn granted
whose guard had not started at the crash is asked for again (the same request, by its id) and
runs there. One line on stderr says it is gone and one that it answers again, on a terminal or
with --notices.

Output to pipes (a harness, a script): both streams in the order the command wrote them, as its
guard's reads timed them (MergedOutput: the logs and their .idx files, about 50 ms behind); to a
terminal, each stream as its events come.

Size: past 600 lines and still one concept, one `ccsup run` from its request to its exit; its
terminal, stdin, exit codes and waiting line are the modules beside it in supervisor.cli.run.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from ...paths import ipc_path
from ..options import DURATION, complete_keys, key_option
from ..output import MergedOutput, OutputFollower
from ..where import emit_json, where

if TYPE_CHECKING:
    from ...client.control import Client
    from ...client.ride_through import TurnRider
    from .terminal import RawTerminal

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
    from .exits import command_status

    return command_status(exited)


def run_key_option(ctx: click.Context, param: click.Parameter, value: str | None) -> str:
    """--key, else $CCSUP_KEY, else `default` (supervisor.cli.run.exits.default_key)."""
    if value is None:
        from .exits import default_key

        value = default_key(os.environ)
    return key_option(ctx, param, value)


def _run_epilog() -> str:
    from .exits import EXIT_CODES_HELP  # pure and tiny: no start-up cost

    return EXIT_CODES_HELP


@click.command(context_settings={"allow_interspersed_args": False}, epilog=_run_epilog())
@click.option(
    "--key",
    callback=run_key_option,
    shell_complete=complete_keys,
    help="The cap key, e.g. codex or opencode:xai (default: $CCSUP_KEY, else `default`).",
)
@click.option("--session", help="The holder's session label.")
@click.option("--agent", help="The holder's agent label.")
@click.option("--harness", help="The holder's harness label (claude, codex, opencode...).")
@click.option(
    "--reservation",
    metavar="ID",
    help="Bind this reservation (`reserve`'s id): held, the turn takes its slot at once.",
)
@click.option(
    "--pass-env",
    is_flag=True,
    help="Give the command this shell's whole environment (as --env would, variable by variable).",
)
@click.option(
    "--cwd", type=click.Path(file_okay=False), help="Working directory (default: this one)."
)
@click.option(
    "--env",
    "env",
    multiple=True,
    callback=env_option,
    metavar="NAME=VALUE",
    help="Set or override a variable for the command (repeatable); NAME alone passes this "
    "shell's value (useful with --clean-env).",
)
@click.option(
    "--clean-env",
    is_flag=True,
    help="Start from the supervisor's environment instead of this shell's (only --env added).",
)
@click.option(
    "--wait-timeout",
    type=DURATION,
    help='Give up after waiting this long for a slot ("2s", "5m").',
)
@click.option(
    "--timeout",
    type=DURATION,
    metavar="D",
    help='Stop the turn after it ran this long ("30m", "90s"); it then exits 124.',
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the turn's events as JSON lines instead of its output.",
)
@click.option(
    "-i",
    "--interactive",
    is_flag=True,
    help="Forward this terminal's input to CMD as a pipe (without -i, a terminal as stdin "
    "gives CMD /dev/null; a pipe or a file is always forwarded).",
)
@click.option(
    "-t",
    "--tty",
    "want_tty",
    is_flag=True,
    help="Give CMD a terminal of its own (a pty): this one goes raw while it runs, keys, "
    "Ctrl-C and Ctrl-Z included, and its size go to CMD.",
)
@click.option(
    "-q",
    "--quiet",
    is_flag=True,
    help="Say nothing of the turn itself on stderr (its id, queued, started); errors still show.",
)
@click.option("--quiet-start", is_flag=True, hidden=True)  # `ccsup wrap`: said only if it waited
@click.option(
    "--notices",
    is_flag=True,
    help="Say on stderr when the turn's supervisor is gone and when one answers again, also "
    "when stderr is not a terminal (by default only a terminal hears it: a harness reading "
    "the command's output through a pipe gets the command's bytes alone).",
)
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_context
def run(
    ctx: click.Context,
    key: str,
    session: str | None,
    agent: str | None,
    harness: str | None,
    reservation: str | None,
    pass_env: bool,
    cwd: str | None,
    env: dict[str, str],
    clean_env: bool,
    wait_timeout: float | None,
    timeout: float | None,
    as_json: bool,
    interactive: bool,
    want_tty: bool,
    quiet: bool,
    notices: bool,
    cmd: tuple[str, ...],
    quiet_start: bool = False,
) -> None:
    """Run CMD as one turn of KEY: wait for a slot, stream its output, exit with its status.

    CMD gets this shell's environment and directory. A pipe or a file as stdin is forwarded to
    CMD, end of input included; a terminal only with -i (else CMD's stdin is /dev/null), or as
    CMD's own terminal with -t.

    \b
    Examples:
      ccsup run --key codex -- codex exec "fix the tests"
      git diff | ccsup run -- llm "review this"
      ccsup run -t -- bash"""
    import uuid

    from guardd.procs import start_ticks

    from .terminal import RawTerminal, stdin_mode, tty_needed_message, window_size

    if want_tty and not os.isatty(0):
        raise click.UsageError(tty_needed_message())
    mode = stdin_mode(want_tty=want_tty, interactive=interactive)
    from ...wire.args import exec_size_problem

    too_big = exec_size_problem(list(cmd), env if clean_env else {**os.environ, **env})
    if too_big is not None:  # E2BIG, said before asking: the supervisor would refuse it too
        raise click.UsageError(too_big)

    holder: dict[str, int | str | None] = {"pid": os.getpid(), "start": start_ticks(os.getpid())}
    if session:
        holder["session"] = session
    if agent:
        holder["agent"] = agent
    if harness:
        holder["harness"] = harness
    if pass_env:
        from ...wire.protocol import passed_env

        env = {**passed_env(), **env}
    turn_id = uuid.uuid4().hex
    with where(ctx).client() as client, client.subscribe([f"turn.{turn_id}."]) as sub:
        sub.expect_turn(turn_id)  # live before the request: a lost end is inferred, not awaited
        runner = _TurnRunner(client, turn_id, key, as_json, quiet=quiet, notices=notices)
        runner.quiet_start = quiet_start
        from ...client.ride_through import TurnRider

        runner.rider = TurnRider(client, turn_id)  # rides through a supervisor's restart
        if mode != "null":  # supervisor.cli.run.stdin_forward, once started
            runner.forward_stdin = where(ctx).client
        if mode == "tty":
            runner.raw = RawTerminal()

        def ask() -> dict:
            return client.turn_limited(
                key,
                list(cmd),
                timeout=timeout,
                id=turn_id,
                cwd=os.path.abspath(cwd or os.getcwd()),
                env=env or None,
                inherit_env=not clean_env,  # the caller's world, as timeout(1) or nice(1) pass it
                holder=holder,
                reservation=reservation,
                wait_timeout=wait_timeout,
                stdin=mode,
                winsize=window_size() if mode == "tty" else None,
            )

        # the same request again, when a restarted supervisor holds the turn for us: it was
        # granted before the crash and its guard never started (supervisor.turns.rerun)
        runner.rider.ask_again = ask
        with _sigint_queued() as interrupts, _rejected_exits(ctx, turn_id):
            # asked again by its id when its supervisor died before it answered (ride_through)
            reply, again = runner.rider.ask_through(interrupted=lambda: bool(interrupts))
            try:
                if isinstance(reply, dict) and reply.get("state") == "queued":
                    runner.waiting(reply.get("position"))
                code = None
                for missed in runner.rider.catch_up() if again is not None else ():
                    if (code := runner._event(*missed)) is not None:
                        break
                if code is None:
                    code = _followed(runner, again or sub, interrupts)
            finally:
                if again is not None:
                    again.close()
    ctx.exit(code)


def _followed(runner: _TurnRunner, sub, interrupts: list[int]) -> int:
    """runner.follow, with a raw terminal restored on every way out; SIGTERM or SIGHUP then ends
    this process as that signal would (its turn is stopped: its requester is gone)."""
    from .terminal import ended_by_signal, exit_for_signal

    try:
        return runner.follow(sub, interrupts)
    except Exception as e:
        signum = ended_by_signal(e)
        if signum is None:
            raise
        if runner.raw is not None:
            runner.raw.restore()
        exit_for_signal(signum)
        raise
    finally:
        if runner.raw is not None:
            runner.raw.restore()
        if runner.rider is not None:
            runner.rider.close()


class _rejected_exits:
    """A turn request the supervisor refuses ends `ccsup run` with EXIT_REJECTED (65), saying why."""

    def __init__(self, ctx: click.Context, turn_id: str):
        self.ctx = ctx
        self.turn_id = turn_id

    def __enter__(self) -> None:
        pass

    def __exit__(self, kind, error, tb) -> None:
        from ...client.control import RemoteError
        from .exits import EXIT_REJECTED

        if isinstance(error, RemoteError) and error.code in ("bad_request", "conflict", "stopping"):
            click.echo(f"ccsup: turn {self.turn_id} rejected: {error.message}", err=True)
            self.ctx.exit(EXIT_REJECTED)


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

    def __init__(
        self,
        client: Client,
        turn_id: str,
        key: str,
        as_json: bool,
        *,
        quiet: bool = False,
        notices: bool = False,
    ):
        self.client = client
        self.quiet = quiet or as_json  # --json: the events say it all
        # A supervisor gone and back: said on a terminal, or with --notices; never inside the
        # command's output as a harness reads it (2>&1 into one pipe).
        self.notices = not self.quiet and (notices or sys.stderr.isatty())
        self.turn_id = turn_id
        self.key = key
        self.as_json = as_json
        self.exited: dict | None = None
        self.stop_reason: str | None = None  # of its `stopping` event
        self.interrupted = False  # Ctrl-C cancelled it from here
        # a Client factory: forward our stdin once the turn started (supervisor.cli.run.stdin_forward)
        self.forward_stdin: Callable[..., Client] | None = None
        self.raw: RawTerminal | None = None  # -t: the user's terminal, raw while the turn runs
        self.rider: TurnRider | None = None  # supervisor.client.ride_through
        self._shown_position = None
        self._waiting: tuple | None = None
        self.granted = False
        self._said_started = False
        self.quiet_start = False  # `ccsup wrap`: its start said only after a wait that was shown
        from .wait_line import WaitLine  # on a terminal: one line kept current while waiting

        self.wait_line = WaitLine(turn_id, key, self._why) if sys.stderr.isatty() else None
        paths = client.paths
        self.outputs = {
            stream: OutputFollower(paths.output_log(turn_id, stream), getattr(sys, stream).buffer)
            for stream in ("stdout", "stderr")
        }
        # To pipes (a harness, a script), both streams in the order they were written, from the
        # logs (on this machine); to a terminal, each as its events come.
        self.merged: MergedOutput | None = None
        if not as_json and not sys.stdout.isatty() and ipc_path(client.control_endpoint):
            outs = {stream: getattr(sys, stream).buffer for stream in ("stdout", "stderr")}
            self.merged = MergedOutput(paths.output_log(turn_id, "stdout").parent, outs)

    def waiting(self, position) -> None:
        """Note that the turn waits; said on stderr only if it still waits WAIT_NOTICE s later
        (every turn passes through `queued`, and a free slot grants it at once)."""
        if not self.granted:
            self._waiting = (position, time.monotonic())

    def _show_waiting(self) -> None:
        if self._waiting is None or self.granted or self.quiet:
            return
        position, since = self._waiting
        if self.wait_line is not None and time.monotonic() - since >= WAIT_NOTICE:
            from .wait_line import in_foreground

            if in_foreground():
                return self.wait_line.show(position, since)
            self.wait_line.finish()  # put in the background (Ctrl-Z, bg): plain lines from now
        if position == self._shown_position or time.monotonic() - since < WAIT_NOTICE:
            return
        self._shown_position = position
        where = f" (position {position})" if position is not None else ""
        click.echo(
            f"ccsup: turn {self.turn_id}: queued{where}, waiting for a slot of {self.key}",
            err=True,
        )
        why = self._why()
        if why and why.get("reason") != "key_full" and "slot of the key" not in why["detail"]:
            from ..views.keys import clock_time

            until = f" (until {clock_time(why['until'])})" if why.get("until") else ""
            click.echo(f"ccsup: {self.key}: {why['detail']}{until}", err=True)

    def _why(self) -> dict | None:
        """Why this turn waits, as ps says (a pause, a rate window, the machine cap...)."""
        from ...errors import CcsupError

        try:
            waits = self.client.ps().get("waits", [])
        except CcsupError:
            return None
        mine = [w.get("why") for w in waits if w.get("id") == self.turn_id]
        return mine[0] if mine and isinstance(mine[0], dict) else None

    def follow(self, sub, interrupts: list[int]) -> int:
        from ...client.control import RemoteError

        cancel_sent = False
        quiet_since = time.monotonic()
        resubscribed = None  # a subscription made after a restart, closed here
        try:
            while True:
                if interrupts and not cancel_sent:
                    if self.wait_line is not None:
                        self.wait_line.finish()
                    cancel_sent = True
                    self.interrupted = True
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
                if self.raw is not None and self.raw.resized:
                    self._send_size()
                event = sub.recv(0.1)
                self._show_waiting()
                if event is None and self.merged is not None:
                    self.merged.pump()  # what waited for its LAG
                if event is None:
                    if self.rider is not None and self.rider.gone():
                        sub.close()
                        sub = resubscribed = None
                        got = self._ride_through(interrupts)
                        if isinstance(got, int):
                            return got
                        sub = resubscribed = got
                        for missed in self.rider.catch_up():
                            if (done := self._event(*missed)) is not None:
                                return done
                        # The subscription is live: what the logs hold now is printed, and the
                        # bus brings the rest (repeats write nothing). Output published before
                        # it was live (while our stdin's send reached the new supervisor first)
                        # would otherwise wait for the next event to show its hole.
                        self._copy_logs()
                    elif self.rider is None and time.monotonic() - quiet_since > 1.0:
                        self.client.check_running()  # NotRunning: no terminal event will come
                        quiet_since = time.monotonic()
                    elif (
                        self.rider is not None
                        and time.monotonic() - quiet_since > 1.0
                        and (sub.gaps or self._behind())
                    ):
                        # Events were lost (our queue overflowed while we wrote a burst out, or
                        # were stopped): the turn's end may have been among them, and then
                        # nothing follows it. The supervisor's `ps` and the history say; the
                        # logs give the output (a look a second while quiet and behind).
                        quiet_since = time.monotonic()
                        for missed in self.rider.catch_up():
                            if (done := self._event(*missed)) is not None:
                                return done
                        self._copy_logs()
                    continue
                quiet_since = time.monotonic()
                if (done := self._event(*event)) is not None:
                    return done
        finally:
            if resubscribed is not None:
                resubscribed.close()

    def _event(self, topic: str, body: dict) -> int | None:
        """on_event, after the events missed before a terminal one that followed a restart."""
        from ...client.subscription import is_terminal

        if self.rider is not None:
            if is_terminal(topic):
                for missed in self.rider.before_end():
                    self.on_event(*missed)
            self.rider.saw(topic)
        return self.on_event(topic, body)

    def _ride_through(self, interrupts: list[int], raw: bool = False):
        """The supervisor is gone: wait for one to answer (one line on stderr each way), then a
        live subscription to the turn on it; else the exit status (71: none came back; 130:
        Ctrl-C while waiting), with the turn's output in its logs printed first."""
        from ...errors import SupervisorLost

        assert self.rider is not None
        rider, state_dir = self.rider, self.client.state_dir
        gone_pid = rider.watch.pid
        if self.wait_line is not None:
            self.wait_line.finish()
        raw = raw or (self.raw is not None and self.raw.saved is not None)
        if self.raw is not None:
            self.raw.restore()  # our lines read as lines meanwhile; raw again once it is back
        if self.notices:
            click.echo(
                f"ccsup: the supervisor on {state_dir} (pid {gone_pid}) is gone; waiting up to "
                f"{rider.watch.wait_limit:g} s for one to take turn {self.turn_id} back",
                err=True,
            )
        told_queued = False
        while (status := rider.await_return(interrupted=lambda: bool(interrupts))) is None:
            if interrupts:
                self._drain_logs()
                return 130
            told, events = rider.on_file()
            if told == "queued":  # acknowledged and waiting in queue.json: a supervisor runs it
                if not told_queued:
                    click.echo(
                        f"ccsup: turn {self.turn_id} is queued, still waiting (no supervisor "
                        f"answers on {state_dir})",
                        err=True,
                    )
                    told_queued = True
                continue
            if told == "ended":
                click.echo(
                    f"ccsup: no supervisor answered on {state_dir}; turn {self.turn_id}'s end "
                    "is read from its files",
                    err=True,
                )
                for missed in events:
                    if (done := self.on_event(*missed)) is not None:
                        return done
            self._drain_logs()
            click.echo(f"ccsup: {rider.lost().message}", err=True)
            return SupervisorLost.exit_code
        if self.notices:
            click.echo(
                f"ccsup: a supervisor answers again on {state_dir} (pid {status.get('pid')}); "
                f"following turn {self.turn_id}",
                err=True,
            )
        sub = rider.resubscribe()
        if sub is None:
            return self._ride_through(interrupts, raw)  # gone again at once
        if raw and self.raw is not None:  # its guard kept the pty: raw again, and its size sent
            self.raw.enter()  # (it may have changed meanwhile, its SIGWINCH sent to nobody)
            self._send_size()
        return sub

    def _copy_logs(self) -> None:
        """Print what the turn's logs hold past what was printed, and go on following."""
        if self.as_json:
            return
        if self.merged is not None:
            return self.merged.pump()
        for follower in self.outputs.values():
            follower.copy_from_file()

    def _behind(self) -> bool:
        """The turn's logs hold bytes that no event brought us: events were dropped for us."""
        if self.as_json or self.merged is not None:
            return False  # printed from the logs themselves: a hole shows in `seq` only
        for follower in self.outputs.values():
            try:
                if follower.path.stat().st_size > follower.position:
                    return True
            except OSError:
                pass
        return False

    def _drain_logs(self) -> None:
        """Print what the turn's logs hold past what was printed (its guard wrote them)."""
        if self.as_json:
            return
        if self.merged is not None:
            return self.merged.pump(final=True)
        for follower in self.outputs.values():
            follower.drain()
            follower.close()

    def _send_size(self) -> None:
        """The terminal's new size to the turn's pty (`send` with `winsize`), after a SIGWINCH."""
        from ...errors import CcsupError
        from .terminal import window_size

        assert self.raw is not None
        self.raw.resized = False
        size = window_size()
        if size is None:
            return
        try:
            self.client.call("send", id=self.turn_id, winsize=size)
        except CcsupError:
            pass  # ended meanwhile: its end event follows

    def _say_started(self) -> None:
        """`started` on stderr, once: on a terminal only (a script's stderr stays CMD's own;
        --json has the id), and for `ccsup wrap` only after a wait that was shown."""
        if self._said_started:
            return
        self._said_started = True
        waited = self._waiting is not None and time.monotonic() - self._waiting[1] >= WAIT_NOTICE
        if not self.quiet and sys.stderr.isatty() and (waited or not self.quiet_start):
            click.echo(f"ccsup: turn {self.turn_id}: started", err=True)

    def on_event(self, topic: str, body: dict) -> int | None:
        from ...client.subscription import is_terminal

        kind = topic.rsplit(".", 1)[-1]
        if self.as_json:
            emit_json({"topic": topic, "body": body})
        if kind in ("stdout", "stderr"):
            self._say_started()  # its first output can come before `started`: the line first
            if self.merged is not None:
                self.merged.pump()
            elif not self.as_json:
                self.outputs[kind].on_event(body)
        elif kind == "queued":
            self.waiting(body.get("position"))
        elif kind in ("granted", "started"):
            self.granted = True
            if self.wait_line is not None:
                self.wait_line.finish()
            if kind == "started":
                self._say_started()
            if kind == "started" and self.raw is not None:
                self.raw.enter()
                self._send_size()  # it may have changed while the turn waited
            if kind == "started" and self.forward_stdin is not None:
                from .stdin_forward import StdinForwarder

                within = self.rider.watch.wait_limit if self.rider is not None else 0.0
                StdinForwarder(self.forward_stdin, self.turn_id, ride_within=within).start()
                self.forward_stdin = None
        elif kind == "stopping":
            self.stop_reason = body.get("reason")
        elif kind == "exited":
            self.exited = body
        if not is_terminal(topic):
            return None
        if self.wait_line is not None:
            self.wait_line.finish()
        if self.raw is not None:
            self.raw.restore()  # before the last output and our own lines
        if self.merged is not None:
            self.merged.pump(final=True)
        elif not self.as_json:
            for stream, follower in self.outputs.items():
                follower.drain()
                follower.close()
                if follower.lost:  # lost on the bus and past the log's [logs] turn_max_bytes
                    click.echo(f"ccsup: {follower.lost} bytes of {stream} were lost", err=True)
        error = (self.exited or {}).get("error")
        if isinstance(error, str) and not self.as_json:  # CMD did not start: as a shell says it
            click.echo(f"ccsup: {error}", err=True)
        from .exits import LOST_WITH_SUPERVISOR, ended_line, lost_line, run_exit_status

        if kind == "released":
            if self.exited is None and not self.as_json:
                click.echo(
                    f"ccsup: turn {self.turn_id} was released without an exit status", err=True
                )
            elif self.stop_reason and not self.as_json:
                click.echo(ended_line(self.turn_id, "stopped", self.stop_reason), err=True)
            elif not self.as_json and self.exited is not None:
                lost = self.exited.get("reason")
                if isinstance(lost, str) and lost in LOST_WITH_SUPERVISOR:  # said, not only 125
                    line = lost_line(self.turn_id, lost)
                    detail = self.exited.get("detail")  # a turn held for us and not run: why
                    click.echo(f"{line} ({detail})" if isinstance(detail, str) else line, err=True)
        elif not self.as_json:
            click.echo(
                ended_line(self.turn_id, kind, body.get("reason")),
                err=True,
            )
        return run_exit_status(
            kind, body, self.exited, self.stop_reason, interrupted=self.interrupted
        )
