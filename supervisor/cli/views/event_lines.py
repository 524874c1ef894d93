"""`ccsup events` as a person reads it: one line an event, `HH:MM:SS.mmm  topic  fields`. Pure.

The topic's turn id is cut to its first 8 characters (`turn.3f2a9c01.started`); the envelope
(`v`, `ts`, the sequence numbers, the id the topic already names) is left out, the holder is
described as `ps` does, a guard as its pid, numbers of seconds to the millisecond, a command
shell-quoted, and any text cut at 80 characters with its newlines shown as `\\n`. `--json`
prints each event whole instead.
"""

from __future__ import annotations

import re
import shlex
import time

SHORT_ID = 8
MAX_TEXT = 80
HIDDEN = {"v", "ts", "seq", "turn_seq", "supervisor_seq", "id", "turn", "epoch"}
_LONG_ID = re.compile(r"\A[0-9a-f]{32}\Z")


def short_id(turn_id: str) -> str:
    return turn_id[:SHORT_ID] if _LONG_ID.match(turn_id) else turn_id


def clock(ts: object) -> str:
    if not isinstance(ts, (int, float)):
        return "--:--:--.---"
    return time.strftime("%H:%M:%S", time.localtime(ts)) + f".{int(ts % 1 * 1000):03d}"


def _text(value: str) -> str:
    shown = value.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
    return shown if len(shown) <= MAX_TEXT else shown[: MAX_TEXT - 3] + "..."


def _value(name: str, value: object) -> str | None:
    from ...wire.requester import describe

    if value is None or value == {} or value == []:
        return None
    if name == "holder" and isinstance(value, dict):
        return describe(value, None)
    if name == "guard" and isinstance(value, dict):
        return str(value.get("pid", "?"))
    if name == "names" and isinstance(value, list):  # leftovers: each by its name
        return _text(",".join(str(n.get("name")) if isinstance(n, dict) else str(n) for n in value))
    if name == "argv" and isinstance(value, list):
        return _text(shlex.join(str(a) for a in value))
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, str):
        return _text(value)
    if isinstance(value, dict):
        return _text(",".join(f"{k}={v}" for k, v in value.items() if v is not None))
    if isinstance(value, list):
        return _text(",".join(map(str, value)))
    return str(value)


def format_event(topic: str, body: dict) -> str:
    parts = topic.split(".")
    if len(parts) == 3 and parts[0] in ("turn", "guard"):
        parts[1] = short_id(parts[1])
    fields = []
    for name, value in body.items():
        if name in HIDDEN:
            continue
        shown = _value(name, value)
        if shown is not None:
            fields.append(f"{name}={shown}")
    return "  ".join([clock(body.get("ts")), ".".join(parts), " ".join(fields)]).rstrip()
