"""`ccsup`: the command line. Each command is a thin shell over supervisor.client.

Exit codes: 0 ok, 1 failure, 2 usage (click's own usage errors and ccsup's UsageError family),
3 no supervisor running on the state directory. `ccsup run` exits with its command's status
instead (128+N for a signal), 125 when the turn's guard was lost, 1 when the turn was cancelled or
rejected. Only CcsupError is caught at the top ("ccsup: <message>" on stderr); anything else is a
bug and shows its traceback.

State: the CLI keeps none. `ccsup start` (without --foreground) re-executes itself as a detached
`python -m supervisor ... start --foreground --log-to-file`, whose stderr goes to
<state>/ccsup.stderr (truncated at each start, so a crash after start-up stays readable), and
returns once the new supervisor answers `status`, or reports the child's stderr and exit code if
it ends first. Run again on a running state directory, it exits 1 saying so. `ccsup run` dying
(even by SIGKILL) leaves nothing: it names itself (pid + start ticks) as the holder, and the
supervisor cancels the turn of a holder that is gone.

Start-up cost: every command pays for what this module imports, so it imports only click and the
errors at the top. The config is imported by the commands that need a state directory, the client
(and with it zmq and the protocol) by those that talk to the supervisor, subprocess by `start`,
and `ccsup config` is loaded only when it is asked for. `ccsup --version` and `--help` import none
of them. The daemon side (daemon, manager, asyncio) is only ever imported by `start --foreground`.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING, BinaryIO

import click

from . import __version__
from .errors import AlreadyRunning, CcsupError, NotRunning, UsageError

if TYPE_CHECKING:
    from pathlib import Path

    from . import config as cfg
    from .client import Client

START_WAIT = 10.0  # seconds `ccsup start` waits for a detached supervisor to answer
STDERR_FILE = "ccsup.stderr"
WAIT_NOTICE = 0.25  # seconds a turn waits before `ccsup run` says so


class CcsupGroup(click.Group):
    """The `ccsup` group: a CcsupError from any command becomes a message and its exit code.

    Commands in LAZY_COMMANDS are listed with the others but imported only when used."""

    LAZY_COMMANDS = {
        "config": ("supervisor.cli_config", "config_group"),
        "web": ("supervisor.web.command", "web"),
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.LAZY_COMMANDS})

    def get_command(self, ctx: click.Context, name: str):
        if name in self.LAZY_COMMANDS and name not in self.commands:
            import importlib

            module, attribute = self.LAZY_COMMANDS[name]
            self.add_command(getattr(importlib.import_module(module), attribute), name)
        return super().get_command(ctx, name)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except CcsupError as e:
            if e.message:
                click.echo(f"ccsup: {e.message}", err=True)
            ctx.exit(e.exit_code)


class Where:
    """The global options, resolved on first use (so --help and --version read no config)."""

    def __init__(self, state_dir_option: str | None, config_option: str | None):
        self.state_dir_option = state_dir_option
        self.config_option = config_option
        self._config: cfg.Config | None = None

    def config(self, path: str | None = None) -> cfg.Config:
        from . import config as cfg

        if path is not None:
            return cfg.load(path, os.environ)
        if self._config is None:
            self._config = cfg.load(self.config_option, os.environ)
        return self._config

    def state_dir(self, config: cfg.Config | None = None) -> Path:
        from . import config as cfg

        return cfg.resolve_state_dir(self.state_dir_option, os.environ, config or self.config())

    def client(self, timeout: float = 5.0) -> Client:
        from .client import Client

        config = self.config()
        state_dir = self.state_dir(config)
        return Client(state_dir, endpoints=config.endpoints.resolve(state_dir), timeout=timeout)


@click.group(cls=CcsupGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ccsup", message="%(prog)s %(version)s")
@click.option(
    "--state-dir",
    envvar="CCSUP_STATE_DIR",
    metavar="DIR",
    help="The supervisor's state directory (also $CCSUP_STATE_DIR; default from the config, "
    "else $XDG_STATE_HOME/ccsup).",
)
@click.option(
    "--config",
    envvar="CCSUP_CONFIG",
    metavar="FILE",
    help="The TOML config (also $CCSUP_CONFIG; default $XDG_CONFIG_HOME/ccsup/ccsup.toml, else built-in).",
)
@click.pass_context
def main(ctx: click.Context, state_dir: str | None, config: str | None) -> None:
    """ccsup: a machine-wide supervisor for capped, contained work."""
    ctx.obj = Where(state_dir, config)


def _where(ctx: click.Context) -> Where:
    return ctx.find_object(Where)


def _emit_json(obj) -> None:
    import json

    click.echo(json.dumps(obj, ensure_ascii=False))


# -- start / stop ----------------------------------------------------------------------------------


def _caps_option(ctx, param, value: str | None) -> dict[str, int] | None:
    if value is None:
        return None
    from .caps import parse_caps_option

    try:
        return parse_caps_option(value)
    except UsageError as e:
        raise click.BadParameter(e.message) from None


@main.command()
@click.option(
    "--foreground",
    is_flag=True,
    help="Run the supervisor in this process (for systemd); log to stderr.",
)
@click.option(
    "--config",
    "config_path",
    metavar="FILE",
    help="The TOML config (wins over the global --config).",
)
@click.option(
    "--caps",
    callback=_caps_option,
    metavar="KEY=N,...",
    help="Caps that win over the config's, e.g. codex=2,opencode:xai=1.",
)
@click.option("--log-to-file", is_flag=True, hidden=True)
@click.pass_context
def start(
    ctx, foreground: bool, config_path: str | None, caps: dict | None, log_to_file: bool
) -> None:
    """Start the supervisor; return once it answers."""
    from . import config as cfg
    from .paths import StatePaths

    where = _where(ctx)
    config = where.config(config_path)
    state_dir = where.state_dir(config)
    config.endpoints.resolve(
        state_dir
    )  # refuses an ipc path too long to bind, before anything starts
    if foreground:
        from .daemon import serve

        ctx.exit(
            serve(
                config,
                state_dir,
                caps_override=caps,
                foreground=not log_to_file,
                config_path=config_path or where.config_option,
            )
        )
    paths = StatePaths(state_dir)
    paths.ensure()
    with where.client(timeout=1.0) as probe:
        if probe.running():
            raise AlreadyRunning(f"a supervisor is already running on {state_dir}{_pid_of(probe)}")
    argv = [sys.executable, "-m", "supervisor", "--state-dir", str(state_dir)]
    if config.source != cfg.EMBEDDED_SOURCE:
        argv += ["--config", os.path.abspath(config.source)]
    argv += ["start", "--foreground", "--log-to-file"]
    if caps:
        argv += ["--caps", ",".join(f"{k}={v}" for k, v in caps.items())]
    child = _spawn_detached(argv, paths.root / STDERR_FILE)
    pid = _wait_until_answering(where, child, state_dir)
    click.echo(f"ccsup started (pid {pid}, state {state_dir})")


def _pid_of(client: Client) -> str:
    try:
        return f" (pid {client.status().get('pid')})"
    except CcsupError:
        return ""


def _spawn_detached(argv: list[str], stderr_path: Path):
    import subprocess

    try:
        fd = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise CcsupError(f"unable to create {stderr_path}: {e.strerror}") from None
    try:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=fd,
            start_new_session=True,
            cwd="/",
        )
    except OSError as e:
        raise CcsupError(f"unable to start the supervisor ({argv[0]}): {e.strerror}") from None
    finally:
        os.close(fd)


def _wait_until_answering(where: Where, child, state_dir: Path) -> int:
    """The detached supervisor's pid once it answers `status`; its stderr and code if it ends first."""
    from .paths import StatePaths

    stderr_path = state_dir / STDERR_FILE
    deadline = time.monotonic() + START_WAIT
    with where.client(timeout=1.0) as client:
        while True:
            code = child.poll()
            if code is not None:
                try:
                    text = stderr_path.read_text(errors="replace").strip()
                except OSError:
                    text = ""
                for line in text.splitlines():
                    click.echo(line, err=True)
                raise _ExitWith(
                    code or 1,
                    "" if text else f"the supervisor exited with status {code} before it answered",
                )
            try:
                status = client.status()
            except NotRunning:
                status = None
            if status is not None and status.get("pid") == child.pid:
                return child.pid
            # A status from another pid: a racing start won; our child will exit "already running".
            if time.monotonic() > deadline:
                raise CcsupError(
                    f"the supervisor (pid {child.pid}) did not answer within {START_WAIT:g} s; it is left "
                    f"running: see {stderr_path} and {StatePaths(state_dir).log}"
                )
            time.sleep(0.02)


class _ExitWith(CcsupError):
    """End the CLI with a given code (and a message when there is one to add)."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.exit_code = code


@main.command()
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    help="Seconds to wait.",
)
@click.pass_context
def stop(ctx, timeout: float) -> None:
    """Stop the supervisor: every turn ended and confirmed gone first."""
    from .client import RemoteError, lock_held

    where = _where(ctx)
    with where.client() as client:
        try:
            client.quit()
        except RemoteError as e:
            if e.code != "stopping":
                raise
        deadline = time.monotonic() + timeout
        while lock_held(client.paths.lock):
            if time.monotonic() > deadline:
                raise CcsupError(
                    f"the supervisor on {client.state_dir} is still stopping after {timeout:g} s; "
                    + _still_running(client)
                )
            time.sleep(0.05)
    click.echo(f"ccsup stopped (state {client.state_dir})")


def _still_running(client: Client) -> str:
    try:
        ps = client.ps()
    except CcsupError as e:
        return f"unable to ask it what still runs: {e.message}"
    busy = [
        f"{s['key']}[{s['index']}] {s['state']} turn {s.get('turn') or '-'} (guard pid {s.get('pid') or '-'})"
        for s in ps.get("slots", [])
        if s.get("state") != "free"
    ]
    return "still running: " + (
        "; ".join(busy) if busy else "no slot is held (it is finishing its shutdown)"
    )


# -- status / ps -----------------------------------------------------------------------------------


def format_age(seconds: float | None) -> str:
    """3s, 2m05s, 1h02m, 2d03h; '-' when unknown."""
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _age(since, now: float) -> str:
    return format_age(now - since) if isinstance(since, (int, float)) else "-"


def format_holder(holder) -> str:
    if not isinstance(holder, dict):
        return "-"
    names = [str(holder[k]) for k in ("session", "agent") if holder.get(k)]
    if names:
        return "/".join(names)
    return f"pid {holder['pid']}" if holder.get("pid") else "-"


def format_groups(groups) -> str:
    if not groups:
        return "-"
    return ",".join(str(g.get("pgid", "?")) if isinstance(g, dict) else str(g) for g in groups)


def format_table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(str(cell).ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]


def format_ps(ps: dict, now: float) -> list[str]:
    slots = ps.get("slots", [])
    waits = ps.get("waits", [])
    lines = []
    if slots:
        rows = [
            [
                s.get("key", "?"),
                str(s.get("index", "?")),
                str(s.get("cap", "?")),
                s.get("state", "?"),
                s.get("turn") or "-",
                format_holder(s.get("holder")),
                str(s.get("pid") or "-"),
                format_groups(s.get("groups")),
                _age(s.get("since"), now),
            ]
            for s in slots
        ]
        lines += format_table(
            ["KEY", "INDEX", "CAP", "STATE", "TURN", "HOLDER", "PID", "GROUPS", "AGE"], rows
        )
    else:
        lines.append("no slots")
    lines.append("")
    if waits:
        rows = [
            [
                str(w.get("position", "?")),
                w.get("id", "?"),
                w.get("key", "?"),
                format_holder(w.get("holder")),
                _age(w.get("since"), now),
            ]
            for w in waits
        ]
        lines += format_table(["POS", "ID", "KEY", "HOLDER", "WAITING"], rows)
    else:
        lines.append("no one waiting")
    return lines


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@click.pass_context
def status(ctx, as_json: bool) -> None:
    """Whether the supervisor runs, and what it does."""
    with _where(ctx).client() as client:
        result = client.status()
    if as_json:
        _emit_json(result)
        return

    started = result.get("started_at")
    click.echo(
        f"ccsup {result.get('version', '?')}, pid {result.get('pid', '?')}, up {_age(started, time.time())}"
    )
    click.echo(f"state   {result.get('state_dir', client.state_dir)}")
    if "config" in result:
        click.echo(f"config  {result['config']}")
    click.echo(f"turns   {result['turns']} active, {result['waits']} waiting")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print exactly the ps result as JSON.")
@click.pass_context
def ps(ctx, as_json: bool) -> None:
    """Slots by key (state, turn, holder, pid, groups, age), then the waiters in order."""
    with _where(ctx).client() as client:
        result = client.ps()
    if as_json:
        _emit_json(result)
        return
    for line in format_ps(result, time.time()):
        click.echo(line)


# -- run -------------------------------------------------------------------------------------------


def _key_option(ctx, param, value: str) -> str:
    from .caps import check_key

    try:
        return check_key(value)
    except UsageError as e:
        raise click.BadParameter(e.message) from None


def _env_option(ctx, param, values: tuple[str, ...]) -> dict[str, str]:
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


class OutputFollower:
    """Copies one stream of a turn to `out`, exactly once per byte.

    The bus carries the output decoded as UTF-8 with replacement; the exact bytes are in the turn's
    log file, so an event is taken as "there is more" and the bytes are read from the file from
    our own position. Only when the file cannot be read does the event's text serve, placed by its
    offset so that nothing is written twice.
    """

    def __init__(self, path: Path, out: BinaryIO):
        self.path = path
        self.out = out
        self.position = 0
        self._file = None

    def _from_file(self) -> bool:
        if self._file is None:
            try:
                self._file = open(self.path, "rb")
            except OSError:
                return False
        self._file.seek(self.position)
        data = self._file.read()
        if data:
            self.out.write(data)
            self.out.flush()
            self.position += len(data)
        return True

    def on_event(self, body: dict) -> None:
        if self._from_file():
            return
        data = str(body.get("data", "")).encode()
        offset = body.get("offset")
        offset = self.position if not isinstance(offset, int) else offset
        end = offset + len(data)
        if end > self.position:
            self.out.write(data[max(0, self.position - offset) :])
            self.out.flush()
            self.position = end

    def drain(self) -> None:
        self._from_file()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


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


@main.command(context_settings={"allow_interspersed_args": False})
@click.option(
    "--key", required=True, callback=_key_option, help="The cap key, e.g. codex or opencode:xai."
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
    callback=_env_option,
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
def run(ctx, key, session, agent, cwd, env, wait_timeout, as_json, cmd) -> None:
    """Run CMD as one turn of KEY: wait for a slot, stream its output, exit with its status."""
    import uuid

    from guardd.procs import start_ticks

    holder = {"pid": os.getpid(), "start": start_ticks(os.getpid())}
    if session:
        holder["session"] = session
    if agent:
        holder["agent"] = agent
    turn_id = uuid.uuid4().hex
    with _where(ctx).client() as client, client.subscribe([f"turn.{turn_id}."]) as sub:
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
        from .client import RemoteError

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
        from .client import is_terminal

        kind = topic.rsplit(".", 1)[-1]
        if self.as_json:
            _emit_json({"topic": topic, "body": body})
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


# -- cancel / events / logs / reap / reload ----------------------------------------------------------


def _turn_id_argument(ctx, param, value: str) -> str:
    from .paths import TURN_ID

    if not TURN_ID.match(value):
        raise click.BadParameter(
            f"{value!r} is not a turn id (1 to 128 letters, digits, '_' or '-')"
        )
    return value


@main.command()
@click.argument("turn_id", metavar="ID", callback=_turn_id_argument)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def cancel(ctx, turn_id: str, as_json: bool) -> None:
    """Cancel a turn in any state (a running one is stopped and released once gone)."""
    with _where(ctx).client() as client:
        result = client.cancel(turn_id)
    if as_json:
        _emit_json(result)
    else:
        click.echo(f"turn {turn_id}: {result.get('state', 'cancelling')}")


@main.command()
@click.argument("prefix", required=False, default="")
@click.option("--json", "as_json", is_flag=True, help='Print {"topic","body"} JSON lines.')
@click.pass_context
def events(ctx, prefix: str, as_json: bool) -> None:
    """Follow the bus: print `topic body` lines until Ctrl-C."""

    def gap(first: int, got: int) -> None:
        click.echo(f"ccsup: missed {got - first} event(s) (seq {first} to {got - 1})", err=True)

    with _where(ctx).client() as client, client.subscribe([prefix], on_gap=gap) as sub:
        try:
            while True:
                event = sub.recv(1.0)
                if event is None:
                    client.check_running()
                    continue
                topic, body = event
                if as_json:
                    _emit_json({"topic": topic, "body": body})
                else:
                    import json

                    click.echo(f"{topic} {json.dumps(body, ensure_ascii=False)}")
        except KeyboardInterrupt:
            ctx.exit(130)


def _turn_active(ps: dict, turn_id: str) -> bool:
    return any(s.get("turn") == turn_id for s in ps.get("slots", [])) or any(
        w.get("id") == turn_id for w in ps.get("waits", [])
    )


@main.command()
@click.argument("turn_id", metavar="ID", callback=_turn_id_argument)
@click.option(
    "-f",
    "--follow",
    is_flag=True,
    help="Keep printing until the turn ends or the supervisor is gone.",
)
@click.option(
    "--stderr", "use_stderr", is_flag=True, help="The turn's stderr instead of its stdout."
)
@click.pass_context
def logs(ctx, turn_id: str, follow: bool, use_stderr: bool) -> None:
    """Print a turn's output log (exact bytes)."""
    from .client import is_terminal

    where = _where(ctx)
    stream = "stderr" if use_stderr else "stdout"
    client = where.client()
    try:
        path = client.paths.output_log(turn_id, stream)
        out = OutputFollower(path, sys.stdout.buffer)
        if follow and not client.running() and not path.exists():
            client.check_running()  # nothing to print and nothing to follow: NotRunning
        if not follow or not client.running():
            if not out._from_file():
                raise CcsupError(f"unable to read the {stream} of turn {turn_id}: no file {path}")
            out.close()
            return
        with client.subscribe([f"turn.{turn_id}."]) as sub:
            if not _turn_active(client.ps(), turn_id) and not path.exists():
                raise CcsupError(
                    f"unable to follow turn {turn_id}: it is not running and has no {stream} log"
                )
            active = _turn_active(client.ps(), turn_id)
            out.drain()
            try:
                while active:
                    event = sub.recv(0.5)
                    out.drain()
                    if event is None:
                        active = client.running()
                    elif is_terminal(event[0]):
                        break
            except KeyboardInterrupt:
                ctx.exit(130)
            out.drain()
            out.close()
    finally:
        client.close()


@main.command()
@click.option(
    "--key",
    callback=lambda c, p, v: None if v is None else _key_option(c, p, v),
    help="Only this key.",
)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def reap(ctx, key: str | None, as_json: bool) -> None:
    """End the work of orphaned slots, confirm it gone, and free them."""
    with _where(ctx).client(timeout=60.0) as client:
        result = client.reap(key)
    if as_json:
        _emit_json(result)
        return
    reaped = result.get("reaped", [])
    if not reaped:
        click.echo("nothing to reap")
    for slot in reaped:
        click.echo(
            f"reaped {slot.get('key', '?')}[{slot.get('index', '?')}] (turn {slot.get('turn') or '-'})"
        )


@main.command()
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def reload(ctx, as_json: bool) -> None:
    """Re-read the configuration (caps and graces; endpoints need a restart)."""
    with _where(ctx).client() as client:
        result = client.reload()
    if as_json:
        _emit_json(result)
    else:
        click.echo(f"reloaded ({result.get('config', 'config')})")
