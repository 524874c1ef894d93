"""`[logs]`: how much turn output is kept (turn_max_bytes, keep, max_bytes).

The values become a `LogLimits`; what they mean (the per-turn limit while the output is written,
pruning oldest first, never a running turn) is supervisor.output.retention's and supervisor.guards.handle's to
say. `keep` is an age: a duration, or days and weeks ("7d", "2w").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import ConfigError
from .schema import Checker, Key, Section, Table
from .values import duration, size


@dataclass(frozen=True)
class LogLimits:
    """[logs]: sizes in bytes, keep in seconds; None is no limit."""

    turn_max_bytes: int | None = None
    keep: float | None = None
    max_bytes: int | None = None


DEFAULT_TURN_MAX_BYTES = "512MiB"
DEFAULT_KEEP = "7d"
DEFAULT_MAX_BYTES = "4GiB"

SECTION = Section(
    ("logs",),
    "Turn output logs (<state_dir>/turns/<id>/): how much is kept. Pruning runs at start and\n"
    "every 5 minutes, oldest first, and never touches a running turn's logs.",
    (
        Key(
            "turn_max_bytes",
            DEFAULT_TURN_MAX_BYTES,
            "A turn's stdout and stderr logs together stop growing here (turn.<id>.truncated\n"
            "says so; the guard drops the rest, so the bus stops there too). 0: no limit.",
        ),
        Key(
            "keep",
            DEFAULT_KEEP,
            'Logs (and history) of turns last written longer ago are pruned ("7d", "12h"). 0: keep.',
        ),
        Key(
            "max_bytes",
            DEFAULT_MAX_BYTES,
            "All turns' logs together: past it the oldest are pruned. 0: no limit.",
        ),
    ),
)

# What an absent [logs] means (the defaults above, parsed).
DEFAULTS = LogLimits(turn_max_bytes=512 << 20, keep=7 * 86400.0, max_bytes=4 << 30)

_DAYS = re.compile(r"\s*(\d+(?:\.\d*)?)\s*([dw])\s*\Z", re.IGNORECASE)


def age(value: object, *, where: str) -> float:
    """Seconds from a duration or "Nd"/"Nw" (days, weeks); 0 means none."""
    if value == 0 or value == "0":
        return 0.0
    if isinstance(value, str):
        match = _DAYS.match(value)
        if match:
            seconds = float(match.group(1)) * (
                86400.0 if match.group(2).lower() == "d" else 604800.0
            )
            if seconds <= 0:
                raise ConfigError(f"{where}: an age must be more than zero, or 0 for none")
            return seconds
    try:
        return duration(value, where=where)
    except ConfigError:
        raise ConfigError(
            f'{where}: {value!r} is not an age (write it like "7d", "2w", "12h", or 0 for none)'
        ) from None


def parse_logs(c: Checker, top: Table) -> LogLimits:
    logs = c.table(top, ("logs",))
    turn_max = c.run(
        ("logs", "turn_max_bytes"), size, logs.get("turn_max_bytes", DEFAULT_TURN_MAX_BYTES)
    )
    keep = c.run(("logs", "keep"), age, logs.get("keep", DEFAULT_KEEP))
    max_bytes = c.run(("logs", "max_bytes"), size, logs.get("max_bytes", DEFAULT_MAX_BYTES))
    return LogLimits(
        turn_max_bytes=turn_max or None,  # 0 (or a problem, reported): no limit
        keep=keep or None,
        max_bytes=max_bytes or None,
    )
