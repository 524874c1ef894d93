"""Protocol v1: the closed vocabulary of the control socket and the bus, encode and decode.

Control: a request is one JSON frame {"v":1, "id", "cmd", "args"}; the reply is
{"v":1, "id", "ok":true, "result"} or {"v":1, "id", "ok":false, "error":{"code","message"}}.
Bus: a message is two frames, a topic and a JSON body carrying "v", "ts" and the event's fields
(the supervisor's own events also "seq"). Sidecars publish `request.turn|reserve|cancel` with the
same bodies as the control commands' args plus a client-made "id".

Everything that arrives is checked here and becomes either a typed request or a ProtocolError with
a code from ERROR_CODES and a message that names the field. Frames over MAX_FRAME bytes are refused
before they are parsed. Knows JSON and field types; nothing of sockets, slots or processes.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

from .caps import check_key
from .errors import UsageError
from .holder import LABELS as HOLDER_LABELS
from .holder import Holder
from .paths import TURN_ID

VERSION = 1
MAX_FRAME = 1 << 20  # 1 MiB: larger frames are refused unparsed
MAX_ARGV = 4096
MAX_WAIT_TIMEOUT = 7 * 24 * 3600.0
MAX_TIMEOUT = 366 * 24 * 3600.0  # a turn's runtime limit
MAX_PAUSE_ASKED = 366 * 24 * 3600.0  # a pause asked for longer is refused (max_pause caps less)

COMMANDS: tuple[str, ...] = ("status", "turn", "reserve", "cancel", "send", "ps", "reap", "reload")
COMMANDS += (
    "quit",
    "pause",
    "resume",
    "metrics",
)  # pause, resume: admission, see parse_pause; metrics: {"text"}
# Commands that take no arguments: anything in their args is refused (a closed vocabulary; a
# `quit` carrying fields it does not know is not obeyed on a guess).
NO_ARGS = ("status", "ps", "reload", "quit", "metrics")
REQUEST_TOPICS = {"request.turn": "turn", "request.reserve": "reserve", "request.cancel": "cancel"}
REQUEST_TOPICS["request.pause"] = "pause"

# The fixed set of error codes a reply may carry.
ERROR_CODES = (
    "bad_request",  # not JSON, wrong frames, wrong types, missing fields
    "too_large",  # a frame over MAX_FRAME
    "unknown_command",
    "unsupported_version",
    "not_found",  # no such turn or reservation
    "conflict",  # an id reused for a different request, a reservation of another holder
    "stopping",  # the supervisor is shutting down and takes no new work
    "failed",  # the command was understood but could not be carried out
)

# A turn's (or reservation's) last event: nothing follows it on `turn.<id>.`.
TERMINAL_EVENTS = ("released", "cancelled", "rejected")
TURN_ENDED = (
    "supervisor.turn_ended"  # published after each terminal event: {id, key, state, turn_seq}
)


class ProtocolError(Exception):
    def __init__(self, code: str, message: str):
        assert code in ERROR_CODES, code
        super().__init__(message)
        self.code = code
        self.message = message


def _bad(message: str) -> ProtocolError:
    return ProtocolError("bad_request", message)


# -- encoding -------------------------------------------------------------------------------------


def dumps(obj: Any) -> bytes:
    """Compact UTF-8 JSON. A lone surrogate (JSON allows "\\ud800", UTF-8 cannot carry it) is sent
    \\u-escaped instead, so echoing what a client sent can never fail to encode."""
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    try:
        return text.encode()
    except UnicodeEncodeError:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=True).encode()


def encode_request(req_id: str, cmd: str, args: dict | None = None) -> bytes:
    return dumps({"v": VERSION, "id": req_id, "cmd": cmd, "args": args or {}})


def encode_ok(req_id: Any, result: dict) -> bytes:
    return dumps({"v": VERSION, "id": req_id, "ok": True, "result": result})


def encode_error(req_id: Any, code: str, message: str) -> bytes:
    return dumps(
        {"v": VERSION, "id": req_id, "ok": False, "error": {"code": code, "message": message}}
    )


def encode_event(
    topic: str,
    fields: dict,
    *,
    seq: int | None = None,
    ts: float | None = None,
    counters: dict[str, int] | None = None,
) -> list[bytes]:
    """`counters`: the family counters (`turn_seq`, `supervisor_seq`) beside `seq`."""
    return [topic.encode(), dumps(event_body(fields, seq=seq, ts=ts, counters=counters))]


def event_body(
    fields: dict,
    *,
    seq: int | None = None,
    ts: float | None = None,
    counters: dict[str, int] | None = None,
) -> dict[str, Any]:
    """An event's body as published: the envelope (v, ts, seq, counters), then its fields."""
    body: dict[str, Any] = {"v": VERSION, "ts": time.time() if ts is None else ts}
    if seq is not None:
        body["seq"] = seq
    if counters:
        body.update(counters)
    body.update(fields)
    return body


def output_body(turn_id: str, offset: int, data: bytes, text: str | None) -> dict:
    """The body of `turn.<id>.stdout|stderr`: {"id","offset","data"} when the chunk is UTF-8
    (`text`), else {"id","offset","data_b64"} with its exact bytes in base64. `offset` is the
    byte offset of the chunk's first byte in the stream (and its log): chunks tile it."""
    if text is not None:
        return {"id": turn_id, "offset": offset, "data": text}
    return {"id": turn_id, "offset": offset, "data_b64": base64.b64encode(data).decode("ascii")}


def output_bytes(body: dict) -> tuple[int, bytes]:
    """An output event's body -> (offset, exact bytes). ProtocolError when it is not one."""
    offset = body.get("offset")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise _bad("an output event has a whole-number 'offset' of 0 or more")
    return offset, _data_field(body, "an output event")


def _data_field(body: dict, what: str) -> bytes:
    """The bytes of 'data' (text, written as UTF-8) or 'data_b64' (base64): at most one of them."""
    text, b64 = body.get("data"), body.get("data_b64")
    if text is not None and b64 is not None:
        raise _bad(f"{what} carries 'data' or 'data_b64', not both")
    if b64 is not None:
        if not isinstance(b64, str):
            raise _bad(f"'data_b64' of {what} must be a base64 string")
        try:
            return base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError):
            raise _bad(f"'data_b64' of {what} is not valid base64") from None
    if text is None:
        return b""
    if not isinstance(text, str):
        raise _bad(f"'data' of {what} must be a string (written as UTF-8)")
    try:
        return text.encode()
    except UnicodeEncodeError:
        raise _bad(
            f"'data' of {what} holds a lone surrogate; send such bytes as 'data_b64'"
        ) from None


def decode_event(frames: list[bytes]) -> tuple[str, dict]:
    """A bus message -> (topic, body). ProtocolError when it is not one."""
    if len(frames) != 2:
        raise _bad(f"a bus message has 2 frames (topic, body), not {len(frames)}")
    topic_raw, body_raw = frames
    if len(topic_raw) > 512 or len(body_raw) > MAX_FRAME:
        raise ProtocolError("too_large", f"a bus message frame is limited to {MAX_FRAME} bytes")
    try:
        topic = topic_raw.decode()
    except UnicodeDecodeError:
        raise _bad("the topic is not UTF-8") from None
    body = _load_object(body_raw, "the body")
    return topic, body


def decode_reply(raw: bytes) -> dict:
    reply = _load_object(raw, "the reply")
    if not isinstance(reply.get("ok"), bool):
        raise _bad("a reply has a boolean 'ok'")
    return reply


# -- decoding requests ----------------------------------------------------------------------------


def _load_object(raw: bytes, what: str) -> dict:
    if len(raw) > MAX_FRAME:
        raise ProtocolError(
            "too_large", f"{what} is {len(raw)} bytes, over the limit of {MAX_FRAME}"
        )
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):
        raise _bad(f"{what} is not valid JSON") from None
    if not isinstance(obj, dict):
        raise _bad(f"{what} must be a JSON object")
    return obj


@dataclass(frozen=True)
class Request:
    id: Any  # echoed back as it came, even when not a string
    cmd: str
    args: dict


def _echoable(req_id: Any) -> Any:
    """The id an error reply may carry back: a string of 1-128 characters or a 64-bit integer."""
    if isinstance(req_id, str) and 1 <= len(req_id) <= 128:
        return req_id
    if type(req_id) is int and -(1 << 63) <= req_id < 1 << 63:
        return req_id
    return None


def _check_version(version: Any) -> None:
    # Exactly the integer 1: `true` and `1.0` compare equal to 1 in Python, not on the wire.
    if type(version) is not int or version != VERSION:
        shown = (
            repr(version)[:32]
            if isinstance(version, (int, float, str))
            else f"a {type(version).__name__}"
        )
        raise ProtocolError(
            "unsupported_version", f"this supervisor speaks protocol v{VERSION}, not {shown}"
        )


def decode_request(raw: bytes) -> Request:
    """One control frame -> Request. ProtocolError otherwise; its `request_id` is set if known."""
    obj = _load_object(raw, "the request")
    req_id = obj.get("id")
    try:
        _check_version(obj.get("v"))
        if not isinstance(req_id, str) or not 1 <= len(req_id) <= 128:
            raise _bad("'id' must be a string of 1 to 128 characters")
        cmd = obj.get("cmd")
        if not isinstance(cmd, str):
            raise _bad("'cmd' must be a string")
        if cmd not in COMMANDS:
            raise ProtocolError(
                "unknown_command", f"unknown command {cmd[:64]!r}; known: {', '.join(COMMANDS)}"
            )
        args = obj.get("args", {})
        if args is None:
            args = {}
        if not isinstance(args, dict):
            raise _bad("'args' must be an object")
        if cmd in NO_ARGS and args:
            raise _bad(f"'{cmd}' takes no arguments, not {sorted(map(str, args))[0][:64]!r}")
    except ProtocolError as e:
        e.request_id = _echoable(req_id)  # type: ignore[attr-defined]
        raise
    return Request(req_id, cmd, args)


# -- the commands' arguments ----------------------------------------------------------------------


def _opt_str(args: dict, name: str, limit: int = 4096) -> str | None:
    value = args.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > limit:
        raise _bad(f"'{name}' must be a string of at most {limit} characters")
    return value


def _opt_int(args: dict, name: str, low: int, high: int) -> int | None:
    value = args.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _bad(f"'{name}' must be a whole number from {low} to {high}")
    return value


def check_id(value: Any, name: str = "id") -> str:
    if not isinstance(value, str) or not TURN_ID.match(value):
        raise _bad(f"'{name}' must be 1 to 128 letters, digits, '_' or '-'")
    return value


def _key(value: Any) -> str:
    """A request's cap key (caps.check_key), refused as a bad_request."""
    try:
        return check_key(value, name="'key'")
    except UsageError as e:
        raise _bad(e.message) from None


def parse_holder(value: Any) -> Holder:
    if value is None:
        return Holder()
    if not isinstance(value, dict):
        raise _bad("'holder' must be an object")
    unknown = set(value) - set(HOLDER_LABELS) - {"pid", "start"}
    if unknown:
        raise _bad(f"'holder' has unknown field {sorted(unknown)[0][:64]!r}")
    labels = {name: _opt_str(value, name, 256) for name in HOLDER_LABELS}
    pid = _opt_int(value, "pid", 1, 1 << 22)
    start = _opt_int(value, "start", 0, 1 << 62)
    return Holder(**labels, pid=pid, start=start)


def _wait_timeout(args: dict) -> float | None:
    value = args.get("wait_timeout")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _bad("'wait_timeout' must be a number of seconds")
    if not 0 < value <= MAX_WAIT_TIMEOUT:
        raise _bad(f"'wait_timeout' must be above 0 and at most {MAX_WAIT_TIMEOUT:.0f} seconds")
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


_TURN_FIELDS = {
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
        raise _bad(f"{what} has unknown field {sorted(map(str, unknown))[0][:64]!r}")
    # A bus body carries the envelope's "v" and "ts": a newer version is not run on a guess.
    if "v" in args and "v" in known:
        _check_version(args["v"])
    if "ts" in args and "ts" in known:
        ts = args["ts"]
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
            raise _bad("'ts' must be a number of epoch seconds")


def parse_turn(args: dict) -> TurnArgs:
    _reject_unknown(args, _TURN_FIELDS, "a turn request")
    turn_id = None if args.get("id") is None else check_id(args["id"])
    key = _key(args.get("key"))
    argv = args.get("argv")
    if not isinstance(argv, list) or not argv or len(argv) > MAX_ARGV:
        raise _bad(f"'argv' must be a non-empty list of at most {MAX_ARGV} strings")
    if not all(isinstance(a, str) and "\0" not in a for a in argv):
        raise _bad("'argv' must hold only strings without NUL characters")
    cwd = _opt_str(args, "cwd")
    if cwd is not None and (not cwd.startswith("/") or "\0" in cwd):
        raise _bad("'cwd' must be an absolute path")
    env = args.get("env")
    if env is None:  # absent; but false, 0, "" or [] are wrong types, not "no env"
        env = {}
    if not isinstance(env, dict):
        raise _bad("'env' must be an object of name: string or null")
    for name, value in env.items():
        if not name or "=" in name or "\0" in name or len(name) > 1024:
            raise _bad(f"'env' has a bad variable name {name[:64]!r}")
        if value is not None and (not isinstance(value, str) or "\0" in value):
            raise _bad(f"'env' value of {name[:64]!r} must be a string or null")
    reservation = (
        None if args.get("reservation") is None else check_id(args["reservation"], "reservation")
    )
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
        res_id, _key(args.get("key")), parse_holder(args.get("holder")), _wait_timeout(args)
    )


def parse_cancel(args: dict) -> str:
    _reject_unknown(args, {"id", "v", "ts"}, "a cancel request")
    return check_id(args.get("id"))


@dataclass(frozen=True)
class SendArgs:
    id: str
    data: bytes
    eof: bool


def parse_send(args: dict) -> SendArgs:
    """'data' (text, written as UTF-8) or 'data_b64' (any bytes, base64), and 'eof'."""
    _reject_unknown(args, {"id", "data", "data_b64", "eof"}, "a send request")
    data = _data_field(args, "a send request")
    eof = args.get("eof", False)
    if not isinstance(eof, bool):
        raise _bad("'eof' must be true or false")
    return SendArgs(check_id(args.get("id")), data, eof)


def parse_reap(args: dict) -> str | None:
    _reject_unknown(args, {"key"}, "a reap request")
    key = args.get("key")
    return None if key is None else _key(key)


def _seconds(args: dict, name: str, limit: float) -> float | None:
    """An optional number of seconds above 0 and at most `limit`."""
    value = args.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _bad(f"'{name}' must be a number of seconds")
    if not 0 < value <= limit:
        raise _bad(f"'{name}' must be above 0 and at most {limit:.0f} seconds")
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
    key = _key(args.get("key"))
    for_ = _seconds(args, "for", MAX_PAUSE_ASKED)
    until = args.get("until")
    if until is not None and (
        isinstance(until, bool) or not isinstance(until, (int, float)) or not math.isfinite(until)
    ):
        raise _bad("'until' must be a time in epoch seconds")
    if (for_ is None) == (until is None):
        raise _bad("a pause takes exactly one of 'for' (seconds) and 'until' (epoch seconds)")
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
    return ResumeArgs(_key(args.get("key")), _opt_str(args, "reason", 1024))
