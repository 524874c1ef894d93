"""Protocol v1: the closed vocabulary of the control socket and the bus, encode and decode.

Control: a request is one JSON frame {"v":1, "id", "cmd", "args"}; the reply is
{"v":1, "id", "ok":true, "result"} or {"v":1, "id", "ok":false, "error":{"code","message"}}.
A reply longer than MAX_FRAME (a `ps` of 10,000 waiters is about 4 MiB) is sent as one message of
several frames, each at most MAX_FRAME bytes, whose bytes joined are the JSON document
(`reply_frames`, `decode_reply_frames`): one document, taken at one instant, never pages that could
disagree; a reader takes at most MAX_REPLY bytes in all. Rejected: paging `ps` by cursor (each page
another instant: a waiter granted between two pages shows in neither or both) and raising
MAX_FRAME (every peer would buffer that much for every request it sends).
Bus: a message is two frames, a topic and a JSON body carrying "v", "ts" and the event's fields
(the supervisor's own events also "seq"). Sidecars publish `request.turn|reserve|cancel|pause|quota`
with the same bodies as the control commands' args plus a client-made "id".

This module knows the envelope: the commands, topics and error codes, the version, frame sizes,
the id grammar, the bodies of events and of output (`data` / `data_b64`, both ways), and what of
a client's environment a turn's `env` can carry (`passed_env`). Every
frame that arrives is checked here and becomes either a Request (its `args` still a plain object)
or a ProtocolError with a code from ERROR_CODES and a message that names the field. Frames over
MAX_FRAME bytes are refused before they are parsed. What each command's args mean, and their
checks, are command_args's. Knows JSON and field types; nothing of sockets, slots or processes.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import time
from dataclasses import dataclass
from typing import Any

from ..paths import TURN_ID

VERSION = 1
MAX_FRAME = 1 << 20  # 1 MiB: larger frames are refused unparsed
MAX_REPLY = 1 << 30  # a reply of several frames: at most this many bytes in all (see above)

COMMANDS: tuple[str, ...] = ("status", "turn", "reserve", "cancel", "send", "ps", "reap", "reload")
COMMANDS += (
    "quit",
    "pause",
    "resume",
    "metrics",
    "quota",
)  # pause, resume, quota: admission, see command_args.parse_pause, parse_quota; metrics: {"text"}
# Commands that take no arguments: anything in their args is refused (a closed vocabulary; a
# `quit` carrying fields it does not know is not obeyed on a guess).
NO_ARGS = ("status", "ps", "reload", "metrics")  # quit: {drain?} (command_args.parse_quit)
REQUEST_TOPICS = {"request.turn": "turn", "request.reserve": "reserve", "request.cancel": "cancel"}
REQUEST_TOPICS["request.pause"] = "pause"
REQUEST_TOPICS["request.quota"] = "quota"  # {id, key, window, used, resets_at}: key.<key>.quota

# The fixed set of error codes a reply may carry.
ERROR_CODES = (
    "bad_request",  # not JSON, wrong frames, wrong types, missing fields
    "too_large",  # a frame over MAX_FRAME
    "unknown_command",
    "unsupported_version",
    "not_found",  # no such turn or reservation
    "conflict",  # an id reused for a different request, a reservation of another holder
    "stopping",  # the supervisor is shutting down and takes no new work
    "no_space",  # the request could not be saved (a full disk): nothing of it was queued
    "busy",  # a send past what a turn's stdin may hold unread: nothing taken, retry later
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


def bad_request(message: str) -> ProtocolError:
    """The error for a frame or field that is not what the protocol says (code bad_request)."""
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
    epoch: str | None = None,
) -> list[bytes]:
    """`counters`: the family counters (`turn_seq`, `supervisor_seq`) beside `seq`."""
    body = event_body(fields, seq=seq, ts=ts, counters=counters, epoch=epoch)
    return [topic.encode(), dumps(body)]


def event_body(
    fields: dict,
    *,
    seq: int | None = None,
    ts: float | None = None,
    counters: dict[str, int] | None = None,
    epoch: str | None = None,
) -> dict[str, Any]:
    """An event's body as published: the envelope (v, ts, epoch, seq, counters), then its fields.

    `epoch` names the supervisor run that published it (`seq` and the family counters start
    again at 1 in each run), so a subscriber tells a restart (a new epoch) from a gap."""
    body: dict[str, Any] = {"v": VERSION, "ts": time.time() if ts is None else ts}
    if epoch is not None:
        body["epoch"] = epoch
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
        raise bad_request("an output event has a whole-number 'offset' of 0 or more")
    return offset, data_field(body, "an output event")


def data_field(body: dict, what: str) -> bytes:
    """The bytes of 'data' (text, written as UTF-8) or 'data_b64' (base64): at most one of them."""
    text, b64 = body.get("data"), body.get("data_b64")
    if text is not None and b64 is not None:
        raise bad_request(f"{what} carries 'data' or 'data_b64', not both")
    if b64 is not None:
        if not isinstance(b64, str):
            raise bad_request(f"'data_b64' of {what} must be a base64 string")
        try:
            return base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError):
            raise bad_request(f"'data_b64' of {what} is not valid base64") from None
    if text is None:
        return b""
    if not isinstance(text, str):
        raise bad_request(f"'data' of {what} must be a string (written as UTF-8)")
    try:
        return text.encode()
    except UnicodeEncodeError:
        raise bad_request(
            f"'data' of {what} holds a lone surrogate; send such bytes as 'data_b64'"
        ) from None


def send_data(data: str | bytes) -> dict[str, str]:
    """The data field of a send request: 'data' for text (and UTF-8 bytes), else 'data_b64'."""
    if isinstance(data, str):
        return {"data": data}
    try:
        return {"data": data.decode()}
    except UnicodeDecodeError:
        return {"data_b64": base64.b64encode(data).decode("ascii")}


def decode_event(frames: list[bytes]) -> tuple[str, dict]:
    """A bus message -> (topic, body). ProtocolError when it is not one."""
    if len(frames) != 2:
        raise bad_request(f"a bus message has 2 frames (topic, body), not {len(frames)}")
    topic_raw, body_raw = frames
    if len(topic_raw) > 512 or len(body_raw) > MAX_FRAME:
        raise ProtocolError("too_large", f"a bus message frame is limited to {MAX_FRAME} bytes")
    try:
        topic = topic_raw.decode()
    except UnicodeDecodeError:
        raise bad_request("the topic is not UTF-8") from None
    body = _load_object(body_raw, "the body")
    return topic, body


def decode_reply(raw: bytes) -> dict:
    reply = _load_object(raw, "the reply")
    if not isinstance(reply.get("ok"), bool):
        raise bad_request("a reply has a boolean 'ok'")
    return reply


def reply_frames(raw: bytes) -> list[bytes]:
    """An encoded reply as the frames it is sent in: one, or pieces of MAX_FRAME bytes."""
    if len(raw) <= MAX_FRAME:
        return [raw]
    return [raw[i : i + MAX_FRAME] for i in range(0, len(raw), MAX_FRAME)]


def decode_reply_frames(frames: list[bytes]) -> dict:
    """A reply as received (its frames after the envelope) -> the reply (decode_reply)."""
    if frames and frames[0] == b"":  # a REQ-style delimiter
        frames = frames[1:]
    if len(frames) == 1:
        return decode_reply(frames[0])
    size = sum(len(f) for f in frames)
    if any(len(f) > MAX_FRAME for f in frames) or size > MAX_REPLY:
        raise ProtocolError(
            "too_large", f"the reply is {size} bytes in {len(frames)} frames, over the limits"
        )
    reply = json_object(b"".join(frames), "the reply")
    if not isinstance(reply.get("ok"), bool):
        raise bad_request("a reply has a boolean 'ok'")
    return reply


def json_object(raw: bytes, what: str) -> dict:
    """raw as a JSON object, whatever its size; bad_request when it is not one."""
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):
        raise bad_request(f"{what} is not valid JSON") from None
    if not isinstance(obj, dict):
        raise bad_request(f"{what} must be a JSON object")
    return obj


# -- decoding requests ----------------------------------------------------------------------------


def _load_object(raw: bytes, what: str) -> dict:
    if len(raw) > MAX_FRAME:
        raise ProtocolError(
            "too_large", f"{what} is {len(raw)} bytes, over the limit of {MAX_FRAME}"
        )
    return json_object(raw, what)


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


def check_version(version: Any) -> None:
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
        check_version(obj.get("v"))
        if not isinstance(req_id, str) or not 1 <= len(req_id) <= 128:
            raise bad_request("'id' must be a string of 1 to 128 characters")
        cmd = obj.get("cmd")
        if not isinstance(cmd, str):
            raise bad_request("'cmd' must be a string")
        if cmd not in COMMANDS:
            raise ProtocolError(
                "unknown_command", f"unknown command {cmd[:64]!r}; known: {', '.join(COMMANDS)}"
            )
        args = obj.get("args", {})
        if args is None:
            args = {}
        if not isinstance(args, dict):
            raise bad_request("'args' must be an object")
        if cmd in NO_ARGS and args:
            raise bad_request(f"'{cmd}' takes no arguments, not {sorted(map(str, args))[0][:64]!r}")
    except ProtocolError as e:
        e.request_id = _echoable(req_id)  # type: ignore[attr-defined]
        raise
    return Request(req_id, cmd, args)


# -- ids ------------------------------------------------------------------------------------------


def check_id(value: Any, name: str = "id") -> str:
    """A turn's, reservation's or pause's id (paths.TURN_ID: it names files), else bad_request."""
    if not isinstance(value, str) or not TURN_ID.match(value):
        raise bad_request(f"'{name}' must be 1 to 128 letters, digits, '_' or '-'")
    return value


def passed_env() -> dict[str, str]:
    """This process's environment as a turn's `env` (the agent's: PATH, virtualenvs, keys), less
    what JSON cannot carry exactly (names or values that are not UTF-8)."""
    env = {}
    for name, value in os.environ.items():
        try:
            name.encode()
            value.encode()
        except UnicodeEncodeError:
            continue
        if name and "=" not in name:
            env[name] = value
    return env
