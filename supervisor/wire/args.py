"""The arguments of each command, checked and typed: `parse_<cmd>(args) -> <Cmd>Args`.

A control request's `args` (protocol.decode_request leaves them a plain object) and a bus
request's body (`request.turn|reserve|cancel|pause`, the same fields plus the envelope's "v" and
"ts") come here, one pure function per command: it refuses an unknown field, a wrong type or a
value out of its limit (MAX_ARGV, MAX_WAIT_TIMEOUT, MAX_TIMEOUT, MAX_PAUSE_ASKED) with a
protocol.ProtocolError `bad_request` whose message names the field, and returns a frozen
dataclass (TurnArgs, ReserveArgs, SendArgs, PauseArgs, ResumeArgs, QuotaArgs) or a plain id or key. The
same parse checks a turn restored from queue.json (restore.py), so what was saved runs only if it
would be accepted today.

Knows the fields and their limits, the id grammar and the cap-key grammar (protocol.check_id,
caps.check_key); nothing of the envelope's framing, sockets, the queue or whether an id or key
exists: that is the manager's to answer.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

from ..caps import check_key
from ..errors import UsageError
from ..holder import LABELS as HOLDER_LABELS
from ..holder import Holder
from .protocol import bad_request, check_id, check_version, data_field

MAX_ARGV = 4096
# What exec takes (Linux): each argument or NAME=VALUE string at most MAX_ARG_STRLEN, 32 pages
# with its NUL (so 131,071 bytes), and all of them with their pointers at most ARG_MAX (the
# stack limit's quarter, 2 MiB by default), less EXEC_MARGIN for what the guard adds (CCSUP_TURN).
MAX_ARG_BYTES = 32 * 4096 - 1
EXEC_MARGIN = 8192
MAX_WAIT_TIMEOUT = 7 * 24 * 3600.0
MAX_TIMEOUT = 366 * 24 * 3600.0  # a turn's runtime limit
MAX_PAUSE_ASKED = 366 * 24 * 3600.0  # a pause asked for longer is refused (max_pause caps less)


def _opt_str(args: dict, name: str, limit: int = 4096) -> str | None:
    value = args.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > limit:
        raise bad_request(f"'{name}' must be a string of at most {limit} characters")
    return value


def _opt_int(args: dict, name: str, low: int, high: int) -> int | None:
    value = args.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise bad_request(f"'{name}' must be a whole number from {low} to {high}")
    return value


def parse_key(value: Any) -> str:
    """A request's cap key (caps.check_key), refused as a bad_request."""
    try:
        return check_key(value, name="'key'")
    except UsageError as e:
        raise bad_request(e.message) from None


def parse_holder(value: Any) -> Holder:
    if value is None:
        return Holder()
    if not isinstance(value, dict):
        raise bad_request("'holder' must be an object")
    unknown = set(value) - set(HOLDER_LABELS) - {"pid", "start"}
    if unknown:
        raise bad_request(f"'holder' has unknown field {sorted(unknown)[0][:64]!r}")
    labels = {name: _opt_str(value, name, 256) for name in HOLDER_LABELS}
    pid = _opt_int(value, "pid", 1, 1 << 22)
    start = _opt_int(value, "start", 0, 1 << 62)
    return Holder(**labels, pid=pid, start=start)


def _wait_timeout(args: dict) -> float | None:
    value = args.get("wait_timeout")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad_request("'wait_timeout' must be a number of seconds")
    if not 0 < value <= MAX_WAIT_TIMEOUT:
        raise bad_request(
            f"'wait_timeout' must be above 0 and at most {MAX_WAIT_TIMEOUT:.0f} seconds"
        )
    return float(value)


@dataclass(frozen=True)
class TurnArgs:
    id: str | None
    key: str
    argv: list[str]
    cwd: str | None = None
    env: dict = field(default_factory=dict)  # name -> str | None (None removes)
    holder: Holder = Holder()
    reservation: str | None = None
    wait_timeout: float | None = None
    timeout: float | None = None  # the turn's runtime limit (seconds)
    # True: `env` is the turn's whole environment (`ccsup run` sends its caller's); False: it
    # is added to the supervisor's
    env_replace: bool = False
    stdin: str = "pipe"  # STDIN_MODES
    winsize: tuple[int, int] | None = None  # a "tty" turn's terminal at its start: rows, cols


# What a turn's stdin is: a pipe fed by `send` (until `eof`), /dev/null, or a pseudo-terminal
# that the guard makes (fed by `send`, sized by `resize`).
STDIN_MODES = ("pipe", "null", "tty")

_TURN_FIELDS = {
    "env_replace",
    "stdin",
    "winsize",
    "timeout",
    "id",
    "key",
    "argv",
    "cwd",
    "env",
    "holder",
    "reservation",
    "wait_timeout",
    "v",
    "ts",
}


def _reject_unknown(args: dict, known: set[str], what: str) -> None:
    unknown = set(args) - known
    if unknown:
        raise bad_request(f"{what} has unknown field {sorted(map(str, unknown))[0][:64]!r}")
    # A bus body carries the envelope's "v" and "ts": a newer version is not run on a guess.
    if "v" in args and "v" in known:
        check_version(args["v"])
    if "ts" in args and "ts" in known:
        ts = args["ts"]
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
            raise bad_request("'ts' must be a number of epoch seconds")


MAX_WINSIZE = 0xFFFF  # struct winsize's unsigned short


def parse_winsize(value: Any, name: str) -> tuple[int, int] | None:
    """[rows, cols] of a terminal, each 1..65535; None when absent."""
    if value is None:
        return None
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not all(type(n) is int and 1 <= n <= MAX_WINSIZE for n in value)
    ):
        raise bad_request(f"'{name}' must be [rows, cols], each a whole number from 1 to 65535")
    return value[0], value[1]


def exec_size_problem(argv: list[str], env: dict) -> str | None:
    """Why exec would refuse this command with E2BIG (the size and the limit named), or None.

    env: the environment CMD gets as far as it is known here (a turn's own, or the whole one
    with env_replace); None values (removals) count nothing."""

    def size(text: str) -> int:
        return len(text.encode("utf-8", "surrogateescape"))

    total = 0
    for i, arg in enumerate(argv):
        n = size(arg)
        if n > MAX_ARG_BYTES:
            return (
                f"argument {i} of 'argv' is {n:,} bytes; exec takes at most {MAX_ARG_BYTES:,} "
                "bytes an argument (Linux's MAX_ARG_STRLEN, 128 KiB): pass it in a file or on stdin"
            )
        total += n + 1 + 8
    for name, value in env.items():
        if value is None:
            continue
        n = size(name) + 1 + size(value)
        if n > MAX_ARG_BYTES:
            return (
                f"the variable {name[:64]!r} of 'env' is {n:,} bytes; exec takes at most "
                f"{MAX_ARG_BYTES:,} bytes a variable (Linux's MAX_ARG_STRLEN, 128 KiB)"
            )
        total += n + 1 + 8
    limit = os.sysconf("SC_ARG_MAX") - EXEC_MARGIN
    if total > limit:
        return (
            f"'argv' and 'env' together are {total:,} bytes; exec takes at most {limit:,} "
            "here (ARG_MAX, less what the guard adds): pass the data in a file or on stdin"
        )
    return None


def parse_turn(args: dict) -> TurnArgs:
    _reject_unknown(args, _TURN_FIELDS, "a turn request")
    turn_id = None if args.get("id") is None else check_id(args["id"])
    key = parse_key(args.get("key"))
    argv = args.get("argv")
    if not isinstance(argv, list) or not argv or len(argv) > MAX_ARGV:
        raise bad_request(f"'argv' must be a non-empty list of at most {MAX_ARGV} strings")
    if not all(isinstance(a, str) and "\0" not in a for a in argv):
        raise bad_request("'argv' must hold only strings without NUL characters")
    cwd = _opt_str(args, "cwd")
    if cwd is not None and (not cwd.startswith("/") or "\0" in cwd):
        raise bad_request("'cwd' must be an absolute path")
    env = args.get("env")
    if env is None:  # absent; but false, 0, "" or [] are wrong types, not "no env"
        env = {}
    if not isinstance(env, dict):
        raise bad_request("'env' must be an object of name: string or null")
    for name, value in env.items():
        if not name or "=" in name or "\0" in name or len(name) > 1024:
            raise bad_request(f"'env' has a bad variable name {name[:64]!r}")
        if value is not None and (not isinstance(value, str) or "\0" in value):
            raise bad_request(f"'env' value of {name[:64]!r} must be a string or null")
    reservation = (
        None if args.get("reservation") is None else check_id(args["reservation"], "reservation")
    )
    env_replace = args.get("env_replace", False)
    if not isinstance(env_replace, bool):
        raise bad_request("'env_replace' must be true or false")
    if env_replace and any(value is None for value in env.values()):
        raise bad_request("'env' with 'env_replace' is the whole environment: no null values")
    stdin = "pipe" if args.get("stdin") is None else args["stdin"]
    if stdin not in STDIN_MODES:
        shown = stdin[:64] if isinstance(stdin, str) else stdin
        raise bad_request(f"'stdin' must be one of {', '.join(STDIN_MODES)}, not {shown!r}")
    too_big = exec_size_problem(argv, env)
    if too_big is not None:  # refused before any guard starts, zygote or direct, as E2BIG would
        raise bad_request(too_big)
    winsize = parse_winsize(args.get("winsize"), "winsize")
    if winsize is not None and stdin != "tty":
        raise bad_request("'winsize' is the size of a terminal: it needs 'stdin': 'tty'")
    return TurnArgs(
        id=turn_id,
        key=key,
        argv=list(argv),
        cwd=cwd,
        env=dict(env),
        holder=parse_holder(args.get("holder")),
        reservation=reservation,
        wait_timeout=_wait_timeout(args),
        timeout=_seconds(args, "timeout", MAX_TIMEOUT),
        env_replace=env_replace,
        stdin=stdin,
        winsize=winsize,
    )


@dataclass(frozen=True)
class ReserveArgs:
    id: str | None
    key: str
    holder: Holder
    wait_timeout: float | None = None


def parse_reserve(args: dict) -> ReserveArgs:
    _reject_unknown(args, {"id", "key", "holder", "wait_timeout", "v", "ts"}, "a reserve request")
    res_id = None if args.get("id") is None else check_id(args["id"])
    return ReserveArgs(
        res_id, parse_key(args.get("key")), parse_holder(args.get("holder")), _wait_timeout(args)
    )


def parse_cancel(args: dict) -> str:
    _reject_unknown(args, {"id", "v", "ts"}, "a cancel request")
    return check_id(args.get("id"))


@dataclass(frozen=True)
class SendArgs:
    id: str
    data: bytes
    eof: bool
    winsize: tuple[int, int] | None = None  # a "tty" turn's new terminal size: rows, cols


def parse_send(args: dict) -> SendArgs:
    """'data' (text, written as UTF-8) or 'data_b64' (any bytes, base64), and 'eof'; for a
    "tty" turn also 'winsize' ([rows, cols]: the terminal is resized, CMD gets SIGWINCH)."""
    _reject_unknown(args, {"id", "data", "data_b64", "eof", "winsize"}, "a send request")
    data = data_field(args, "a send request")
    eof = args.get("eof", False)
    if not isinstance(eof, bool):
        raise bad_request("'eof' must be true or false")
    return SendArgs(
        check_id(args.get("id")), data, eof, parse_winsize(args.get("winsize"), "winsize")
    )


def parse_quit(args: dict) -> str | None:
    """`quit {drain?: bool, handover?: bool, force?: bool}`: "drain" (grant nothing new, let
    running turns end first), "handover" (exit without ending a turn: `ccsup restart`), else
    None. `force` (`quit_force`) only with handover."""
    _reject_unknown(args, {"drain", "handover", "force"}, "a quit request")
    force = args.get("force", False)
    if not isinstance(force, bool):
        raise bad_request("'force' must be true or false")
    if force and args.get("handover") is not True:
        raise bad_request("'force' is for a hand-over: it needs 'handover': true")
    chosen = []
    for name in ("drain", "handover"):
        value = args.get(name, False)
        if not isinstance(value, bool):
            raise bad_request(f"'{name}' must be true or false")
        if value:
            chosen.append(name)
    if len(chosen) > 1:
        raise bad_request("'drain' and 'handover' cannot both be true")
    return chosen[0] if chosen else None


def quit_force(args: dict) -> bool:
    """A hand-over's `force` (checked by parse_quit): end the turns that cannot be adopted (on a
    terminal) without refusing."""
    return args.get("force") is True


def parse_reap(args: dict) -> str | None:
    _reject_unknown(args, {"key"}, "a reap request")
    key = args.get("key")
    return None if key is None else parse_key(key)


def _seconds(args: dict, name: str, limit: float) -> float | None:
    """An optional number of seconds above 0 and at most `limit`."""
    value = args.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad_request(f"'{name}' must be a number of seconds")
    if not 0 < value <= limit:
        raise bad_request(f"'{name}' must be above 0 and at most {limit:.0f} seconds")
    return float(value)


# -- admission: pause and resume ------------------------------------------------------------------


@dataclass(frozen=True)
class PauseArgs:
    """`pause {id?, key, for | until, reason?, by?}`; `for` in seconds, `until` in epoch seconds."""

    id: str | None
    key: str
    for_: float | None
    until: float | None
    reason: str | None
    by: str | None

    def end(self, now: float) -> float:
        return self.until if self.until is not None else now + (self.for_ or 0.0)


def parse_pause(args: dict) -> PauseArgs:
    known = {"id", "key", "for", "until", "reason", "by", "v", "ts"}
    _reject_unknown(args, known, "a pause request")
    pause_id = None if args.get("id") is None else check_id(args["id"])
    key = parse_key(args.get("key"))
    for_ = _seconds(args, "for", MAX_PAUSE_ASKED)
    until = args.get("until")
    if until is not None and (
        isinstance(until, bool) or not isinstance(until, (int, float)) or not math.isfinite(until)
    ):
        raise bad_request("'until' must be a time in epoch seconds")
    if (for_ is None) == (until is None):
        raise bad_request(
            "a pause takes exactly one of 'for' (seconds) and 'until' (epoch seconds)"
        )
    return PauseArgs(
        pause_id,
        key,
        for_,
        None if until is None else float(until),
        _opt_str(args, "reason", 1024),
        _opt_str(args, "by", 256),
    )


@dataclass(frozen=True)
class ResumeArgs:
    key: str
    reason: str | None


def parse_resume(args: dict) -> ResumeArgs:
    _reject_unknown(args, {"key", "reason"}, "a resume request")
    return ResumeArgs(parse_key(args.get("key")), _opt_str(args, "reason", 1024))


QUOTA_ACTIONS = ("show", "set", "clear")
QUOTA_SOURCES = ("cli", "bus", "claude-statusline")  # what a client may say it is


@dataclass(frozen=True)
class QuotaArgs:
    """`quota {action?, id?, key?, window?, used?, resets_at?}`: show (KEY optional), set (a
    reading: window, used 0-1, resets_at epoch seconds) or clear (KEY, window optional). The
    reading's values are checked by supervisor.admission.quota.check_reading (it knows windows)."""

    action: str
    id: str | None
    key: str | None
    window: str | None
    used: object
    resets_at: object
    source: str = "cli"  # who told it (a control client may name a reader: claude-statusline)


def parse_quota(args: dict, *, bus: bool = False) -> QuotaArgs:
    """A control `quota` command, or a bus `request.quota` (`bus`: always a set, id required)."""
    known = {"id", "key", "window", "used", "resets_at", "v", "ts"}
    if not bus:
        known |= {"action", "source"}
    _reject_unknown(args, known, "a quota request")
    action = "set" if bus else args.get("action", "show")
    if action not in QUOTA_ACTIONS:
        raise bad_request(f"'action' must be one of {', '.join(QUOTA_ACTIONS)}, not {action!r}")
    quota_id = None if args.get("id") is None else check_id(args["id"])
    if bus and quota_id is None:
        raise bad_request("a request.quota needs an 'id' (its answer, key.<key>.quota, names it)")
    key = None if action == "show" and args.get("key") is None else parse_key(args.get("key"))
    window = _opt_str(args, "window", 64)
    if action == "set":
        for name in ("window", "used", "resets_at"):
            if args.get(name) is None:
                raise bad_request(f"a quota reading needs '{name}'")
    source = args.get("source", "bus" if bus else "cli")
    if source not in QUOTA_SOURCES:
        raise bad_request(f"'source' must be one of {', '.join(QUOTA_SOURCES)}, not {source!r}")
    return QuotaArgs(action, quota_id, key, window, args.get("used"), args.get("resets_at"), source)
