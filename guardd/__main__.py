"""`ccsup-guard` / `python -m guardd`: parse the arguments, then run one turn under a guard.

    ccsup-guard [--record-dir D] [--grace T] [--scan T] [--turn ID] [--bus ENDPOINT]
                [--cgroup PATH] [--deadline-file F] [--tty] [--log-dir D [--log-limit N]]
                [--adopt-within T] -- CMD [ARG...]

--adopt-within T (needs a record directory): when the watched supervisor is gone, the work goes
on for up to T, waiting for a supervisor to adopt the guard over its channel (guardd.channel);
if none does, the work is ended as always, reason "not_adopted". 0 (the default): ended at once.
With it, a pipe on the guard's stdin (CMD's) stays open while no supervisor runs: the guard holds
a writer of it (guardd.stdin) until it ends, or until its channel's op "close_stdin".
--log-dir D: CMD's stdout and stderr go into D/stdout.log and D/stderr.log (and the times of their
reads into D/stdout.idx, D/stderr.idx), written by the guard itself (guardd.output), so they outlive
whoever started it; --log-limit N: both logs together stop growing at N bytes.
--cgroup PATH: run CMD in that cgroup2 cgroup (created when missing; see guardd.cgroup).
--tty: the guard's stdin is a terminal (a pty's slave, `ccsup run -t`): CMD gets a session of its
own with it as its controlling terminal (guardd.child), rather than only a group of its own. With
--log-dir, fd 2 is a master of that pty: the guard holds it and logs its output (guardd.pty).

T is seconds (`0.5`) or a duration (`500ms`, `2s`, `1m`; guardd.durations). Defaults come from the environment:
CCSUP_GUARD_DIR (no record without it or --record-dir), CCSUP_GUARD_GRACE_MS (5000),
CCSUP_GUARD_SCAN_MS (2000), CCSUP_GUARD_DEADLINE_FILE (none). --deadline-file: a dead-man deadline
the starter keeps pushing forward (guardd.deadman); when it passes, the guard ends the turn on its
own. A usage error exits 125, the guard's own failure status, so that a
caller never mistakes it for CMD's. The parser is hand-written: argparse costs a few milliseconds
of every turn's start, and the grammar is small. Stateless.
"""

from __future__ import annotations

import os
import sys

from guardd.durations import parse_duration
from guardd.exits import EXIT_GUARD_FAILURE
from guardd.guard import run_guard
from guardd.options import Options

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the guard's start pays)
if TYPE_CHECKING:
    from collections.abc import Mapping

USAGE = (
    "usage: ccsup-guard [--record-dir D] [--grace T] [--scan T] [--turn ID] [--bus ENDPOINT]"
    " [--cgroup PATH] [--deadline-file F] [--tty] [--log-dir D [--log-limit N]]"
    " [--adopt-within T] -- CMD [ARG...]"
)
_OPTIONS = {
    "--record-dir": "record_dir",
    "--grace": "grace",
    "--scan": "scan",
    "--turn": "turn",
    "--bus": "bus",
    "--cgroup": "cgroup",
    "--deadline-file": "deadline_file",
    "--log-dir": "log_dir",
    "--log-limit": "log_limit",
    "--adopt-within": "adopt_within",
}


class UsageError(ValueError):
    pass


def _duration(text: str, what: str) -> float:
    """A duration option in seconds, finite and >= 0."""
    try:
        seconds = parse_duration(text)
    except ValueError:
        raise UsageError(f"{what}: {text!r} is not a duration (like 0.5, 500ms, 2s)") from None
    if seconds == float("inf"):
        raise UsageError(f"{what}: {text!r} must be a finite duration >= 0")
    return seconds


def _env_ms(env: Mapping[str, str], name: str, default_ms: int) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default_ms / 1000.0
    try:
        ms = float(raw)
    except ValueError:
        raise UsageError(f"${name}: {raw!r} is not a number of milliseconds") from None
    if not ms >= 0 or ms == float("inf"):
        raise UsageError(f"${name}: {raw!r} must be a finite number of milliseconds >= 0")
    return ms / 1000.0


def parse_args(args: list[str], env: Mapping[str, str] | None = None) -> Options:
    env = os.environ if env is None else env
    values: dict[str, str] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            i += 1
            break
        if arg in ("-h", "--help"):
            raise SystemExit(print(USAGE) or 0)
        if not arg.startswith("-"):
            break  # CMD without a `--`
        if arg == "--tty":  # the one flag without a value
            values["tty"] = "1"
            i += 1
            continue
        name, eq, value = arg.partition("=")
        if name not in _OPTIONS:
            raise UsageError(f"unknown option {name}")
        if not eq:
            i += 1
            if i >= len(args):
                raise UsageError(f"{name} needs a value")
            value = args[i]
        values[_OPTIONS[name]] = value
        i += 1
    argv = args[i:]
    if not argv:
        raise UsageError("no command given")
    grace = (
        _duration(values["grace"], "--grace")
        if "grace" in values
        else _env_ms(env, "CCSUP_GUARD_GRACE_MS", 5000)
    )
    scan = (
        _duration(values["scan"], "--scan")
        if "scan" in values
        else _env_ms(env, "CCSUP_GUARD_SCAN_MS", 2000)
    )
    if scan <= 0:
        raise UsageError("the scan interval must be > 0")
    turn = values.get("turn")
    if turn is not None and not turn:
        raise UsageError("--turn must not be empty")
    log_limit = None
    if "log_limit" in values:
        text = values["log_limit"]
        if not text.isdigit():
            raise UsageError(f"--log-limit: {text!r} is not a number of bytes")
        log_limit = int(text)
        if not values.get("log_dir"):
            raise UsageError("--log-limit needs --log-dir")
    adopt_within = (
        _duration(values["adopt_within"], "--adopt-within") if "adopt_within" in values else 0.0
    )
    return Options(
        argv=argv,
        record_dir=values.get("record_dir") or env.get("CCSUP_GUARD_DIR") or None,
        grace=grace,
        scan=scan,
        turn=turn,
        bus=values.get("bus") or None,
        cgroup=values.get("cgroup") or None,
        deadline_file=values.get("deadline_file") or env.get("CCSUP_GUARD_DEADLINE_FILE") or None,
        env=env,
        tty="tty" in values,
        log_dir=values.get("log_dir") or None,
        log_limit=log_limit,
        adopt_within=adopt_within,
    )


def main(
    args: list[str] | None = None,
    parent_fd: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> int:
    """parent_fd: a pidfd to watch instead of the parent's (guardd.zygote gives the supervisor's);
    environ: the guard's environment, CMD's too, instead of os.environ (guardd.zygote's)."""
    try:
        opts = parse_args(sys.argv[1:] if args is None else args, environ)
    except UsageError as e:
        print(f"ccsup-guard: {e}\n{USAGE}", file=sys.stderr)
        return EXIT_GUARD_FAILURE
    return run_guard(opts, parent_fd)


if __name__ == "__main__":
    sys.exit(main())
