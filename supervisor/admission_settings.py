"""What the configuration says about admission, as values: `[slots]` max_pause, rates,
max_runtime, expiring_notice and fairness, and the `[pause_on.<key>]` rules. Pure: no I/O.

These are what supervisor.config builds; the policy that acts on them is beside it
(admission_policy, pauses, rates, runtime_limits, fairness, pause_on) and imports them from here.
So reading a configuration, which every `ccsup` command does, imports none of that policy
(pause_on alone brought subprocess, threading, select and logging): `ccsup ps --json` started
about 20 ms sooner here when every module is compiled from source.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

DEFAULT_MAX_PAUSE = 3600.0  # [slots] max_pause: no pause ends later than now + this
DEFAULT_EXPIRING_NOTICE = 60.0  # [slots] expiring_notice
FAIRNESS = ("fifo", "session")  # [slots] fairness (supervisor.fairness)

# The window part of "N/window": a unit word, or a duration ("10s", "500ms", "2m").
RATE_UNITS = {"s": "1s", "sec": "1s", "second": "1s", "min": "1m", "minute": "1m"}
RATE_UNITS |= {"h": "1h", "hour": "1h"}
_RATE = re.compile(r"\s*([0-9]+)\s*/\s*(\S+)\s*\Z")
MAX_RATE_COUNT = 100_000


@dataclass(frozen=True)
class Rate:
    count: int  # at most this many grants
    window: float  # in any window of this many seconds

    def __str__(self) -> str:
        return f"{self.count}/{self.window:g}s"


def parse_rate(text: object, parse_window: Callable[[str], float]) -> Rate:
    """`"20/min"`, `"3/10s"` -> Rate. `parse_window` turns "10s" into seconds (or raises).

    Raises ValueError with what is wrong; the config names the key and line around it.
    """
    if not isinstance(text, str):
        raise ValueError(f'a rate is a string like "20/min" or "3/10s", not {text!r}')
    match = _RATE.match(text)
    if not match:
        raise ValueError(f'{text!r} is not a rate (write it like "20/min" or "3/10s")')
    count = int(match.group(1))
    if not 1 <= count <= MAX_RATE_COUNT:
        raise ValueError(f"the count of rate {text!r} must be from 1 to {MAX_RATE_COUNT}")
    unit = match.group(2)
    return Rate(count, parse_window(RATE_UNITS.get(unit.lower(), unit)))


@dataclass(frozen=True)
class PauseRule:
    """One `[pause_on.<key>]` table (supervisor.pause_on applies it)."""

    key: str  # the key or bare harness of the section
    stderr: re.Pattern[str] | None = None
    exit_codes: frozenset[int] = frozenset()
    for_: float = 60.0


@dataclass(frozen=True)
class AdmissionSettings:
    """What the configuration says about admission (`[slots]` and `[pause_on.<key>]`)."""

    max_pause: float = DEFAULT_MAX_PAUSE
    rates: Mapping[str, Rate] = field(default_factory=dict)
    max_runtime: Mapping[str, float] = field(default_factory=dict)
    expiring_notice: float = DEFAULT_EXPIRING_NOTICE
    fairness: str = "fifo"
    pause_on: Mapping[str, PauseRule] = field(default_factory=dict)
