"""`ccsup start`: start the supervisor, detached (or in this process with --foreground), and
return once it answers `status`. See the package docstring for what a detached start leaves."""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING

import click

from ..errors import AlreadyRunning, CcsupError, NotRunning, UsageError
from ..polling import wait_until
from .where import Where, where

if TYPE_CHECKING:
    import subprocess
    from pathlib import Path

    from ..client.control import Client

START_WAIT = 30.0  # seconds `ccsup start` waits for a detached supervisor to answer (a loaded
# machine: a start seen past 10 s at a load of 20 on 2 cores)
RESTORE_WAIT = 900.0  # ... and in all, while it is up but restoring its queue (see below)
STDERR_FILE = "ccsup.stderr"


def _caps_option(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> dict[str, int] | None:
    if value is None:
        return None
    from ..caps import parse_caps_option

    try:
        return parse_caps_option(value)
    except UsageError as e:
        raise click.BadParameter(e.message) from None


@click.command()
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
# The detached supervisor of a caller that found no config file: the embedded defaults, even if a
# file has appeared since (`ccsup restart` keeps the config the old supervisor ran with).
@click.option("--embedded-config", is_flag=True, hidden=True)
# `ccsup restart`'s new supervisor: started before the old one has left, it waits up to this many
# seconds for the state directory's lock instead of exiting "already running".
@click.option("--take-over-within", type=float, default=0.0, hidden=True)
@click.option("--ready-fd", type=int, default=None, hidden=True)  # closed once it waits for it
@click.pass_context
def start(
    ctx,
    foreground: bool,
    config_path: str | None,
    caps: dict | None,
    log_to_file: bool,
    embedded_config: bool,
    take_over_within: float,
    ready_fd: int | None,
) -> None:
    """Start the supervisor; return once it answers."""
    from .. import config as cfg
    from ..paths import StatePaths

    options = where(ctx)
    if embedded_config:
        config = cfg.load(None, os.environ, embedded=True)
    else:
        config = options.config(config_path)
    state_dir = options.state_dir(config)
    config.endpoints.resolve(
        state_dir
    )  # refuses an ipc path too long to bind, before anything starts
    clash = sorted(set(caps or {}) & set(config.pools.pools))
    if clash:  # a pool takes no slots: its name capped would never be used
        raise UsageError(
            f"--caps {clash[0]}: {clash[0]} is a pool ([pools] in {config.source}), which has no "
            "cap of its own: cap its members"
        )
    if foreground:
        from ..plain_asyncio import import_asyncio_without_tls

        import_asyncio_without_tls()  # before the daemon's imports: see supervisor.plain_asyncio
        from ..daemon.main import serve

        ctx.exit(
            serve(
                config,
                state_dir,
                caps_override=caps,
                foreground=not log_to_file,
                config_path=config_path or options.config_option,
                lock_wait=take_over_within,
                ready_fd=ready_fd,
            )
        )
    StatePaths(state_dir).ensure()
    with options.client(timeout=1.0) as probe:
        if probe.running():
            raise AlreadyRunning(f"a supervisor is already running on {state_dir}{_pid_of(probe)}")
    config_file = None if config.source == cfg.EMBEDDED_SOURCE else os.path.abspath(config.source)
    pid = start_detached(options, state_dir, config_file, caps)
    click.echo(f"ccsup started (pid {pid}, state {state_dir})")
    from ..guards.containment import limits_not_enforced

    for sentence in limits_not_enforced(config):  # never silently ignored (status says it too)
        click.echo(f"warning: {sentence}", err=True)


def start_detached(
    options: Where, state_dir: Path, config_file: str | None, caps: dict[str, int] | None
) -> int:
    """Start a detached supervisor on state_dir and return its pid once it answers `status`
    (`ccsup start`)."""
    child = spawn_supervisor(state_dir, config_file, caps)
    return wait_until_answering(options, child, state_dir)


def spawn_supervisor(
    state_dir: Path,
    config_file: str | None,
    caps: dict[str, int] | None,
    take_over_within: float = 0.0,
) -> subprocess.Popen[bytes]:
    """`python -m supervisor ... start --foreground --log-to-file`, detached (config_file
    absolute, or None for the embedded defaults). With take_over_within (`ccsup restart`, which
    starts it while the old supervisor still runs), it waits that long for the state directory's
    lock, and returns only once the new process is that far (its imports done): EOF on a pipe
    whose write end it closes then, or its own end."""
    argv = [sys.executable, "-m", "supervisor", "--state-dir", str(state_dir)]
    if config_file is not None:
        argv += ["--config", config_file]
    argv += ["start", "--foreground", "--log-to-file"]
    if config_file is None:
        argv.append("--embedded-config")
    if caps:
        argv += ["--caps", ",".join(f"{k}={v}" for k, v in caps.items())]
    if take_over_within <= 0:
        return _spawn_detached(argv, state_dir / STDERR_FILE)
    ready_r, ready_w = os.pipe()
    try:
        argv += ["--take-over-within", repr(take_over_within), "--ready-fd", str(ready_w)]
        child = _spawn_detached(argv, state_dir / STDERR_FILE, pass_fds=(ready_w,))
        os.close(ready_w)
        ready_w = -1
        os.read(ready_r, 1)  # EOF: it is ready, or gone (then its stderr says why)
    finally:
        os.close(ready_r)
        if ready_w >= 0:
            os.close(ready_w)
    return child


def _pid_of(client: Client) -> str:
    try:
        return f" (pid {client.status().get('pid')})"
    except CcsupError:
        return ""


def _spawn_detached(
    argv: list[str], stderr_path: Path, pass_fds: tuple[int, ...] = ()
) -> subprocess.Popen[bytes]:
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
            pass_fds=pass_fds,
        )
    except OSError as e:
        raise CcsupError(f"unable to start the supervisor ({argv[0]}): {e.strerror}") from None
    finally:
        os.close(fd)


def wait_until_answering(
    options: Where,
    child: subprocess.Popen[bytes],
    state_dir: Path,
    doing: str = "restoring its queue",
) -> int:
    """The detached supervisor's pid once it answers `status`; its stderr and code if it ends
    first. `doing`: what it is said to be busy with while it holds its socket unanswered."""
    from ..paths import StatePaths

    stderr_path = state_dir / STDERR_FILE

    def answering(client: Client) -> bool:
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
            return False
        except CcsupError:  # it holds the lock and its socket, but serves nothing yet: restoring
            if not busy:
                click.echo(
                    f"ccsup: the supervisor (pid {child.pid}) is {doing}; waiting for it to answer",
                    err=True,
                )
            busy.append(time.monotonic())
            return False
        # A status from another pid: a racing start won; our child will exit "already running".
        return status.get("pid") == child.pid

    busy: list[float] = []  # when it was last seen up but not answering yet
    started = time.monotonic()
    with options.client(timeout=1.0) as client:
        while True:
            try:
                wait_until(lambda: answering(client), START_WAIT, 0.02)
                break
            except TimeoutError:
                # A supervisor restoring a large queue answers once it is done: wait on while it
                # lives and was busy lately, up to RESTORE_WAIT in all.
                recent = busy and time.monotonic() - busy[-1] < START_WAIT
                if not recent or time.monotonic() - started > RESTORE_WAIT:
                    raise CcsupError(
                        f"the supervisor (pid {child.pid}) did not answer within "
                        f"{time.monotonic() - started:.0f} s; it is left running: see "
                        f"{stderr_path} and {StatePaths(state_dir).log}"
                    ) from None
    return child.pid


class _ExitWith(CcsupError):
    """End the CLI with a given code (and a message when there is one to add)."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.exit_code = code
