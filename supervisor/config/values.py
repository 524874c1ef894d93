"""The kinds of value a section holds: durations, sizes, caps, non-empty strings, home paths.

Each check is `check(value, *, where) -> checked value` and raises a ConfigError whose message
starts with `where` (the dotted key), so `Checker.run` can place it. Pure: no I/O.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path

from ..caps import MAX_CAP, check_cap
from ..errors import ConfigError, UsageError
from .schema import kind

_SIZE = r"(?i)\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*\Z"  # compiled on first use
# Single letters and IEC names are powers of 1024 (as systemd and docker read "1G"); kB, MB... are SI.
_SIZE_UNIT = {"": 1, "b": 1}
for _i, _letter in enumerate("kmgt", start=1):
    _SIZE_UNIT[_letter] = _SIZE_UNIT[_letter + "i"] = _SIZE_UNIT[_letter + "ib"] = 1024**_i
    _SIZE_UNIT[_letter + "b"] = 1000**_i


def duration(value: object, *, where: str, zero_ok: bool = False) -> float:
    """Seconds from "5s", "500ms", "2m", "1h", "0.5" (guardd.durations' grammar) or a number of
    seconds; must be > 0 (or >= 0 with zero_ok: "0s" turns something off)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        from guardd.durations import parse_duration  # a config of defaults parses no text

        try:
            seconds = parse_duration(value)
        except ValueError:
            raise ConfigError(
                f'{where}: {value!r} is not a duration (write it like "5s", "500ms", "2m", "1h")'
            ) from None
    else:
        raise ConfigError(
            f'{where}: a duration is a string like "5s" or a number of seconds, not {kind(value)}'
        )
    if zero_ok and seconds == 0:
        return 0.0
    if not math.isfinite(seconds) or seconds <= 0:
        least = "zero or more" if zero_ok else "more than zero"
        raise ConfigError(f"{where}: a duration must be {least}, not {value!r}")
    return seconds


def duration_or_zero(value: object, *, where: str) -> float:
    """A duration that may be zero ("0s": off)."""
    return duration(value, where=where, zero_ok=True)


def size(value: object, *, where: str) -> int:
    """Bytes from "2GiB", "512MiB", "1G" (= GiB), "1GB" (10^9), "100k", "4096" or an integer; >= 0."""
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    elif isinstance(value, str):
        match = re.match(_SIZE, value)
        unit = match.group(2).lower() if match else None
        if not match or unit not in _SIZE_UNIT:
            raise ConfigError(
                f'{where}: {value!r} is not a size (write it like "2GiB", "512MiB", "100k" or bytes)'
            )
        size = int(float(match.group(1)) * _SIZE_UNIT[unit])
    else:
        raise ConfigError(
            f'{where}: a size is a string like "2GiB" or a whole number of bytes, not {kind(value)}'
        )
    if size < 0:
        raise ConfigError(f"{where}: a size must not be negative, not {value!r}")
    return size


def cap(value: object, *, where: str) -> int:
    """A cap: a whole number from 1 to caps.MAX_CAP (caps.py decides what a cap is)."""
    try:
        return check_cap(where, value)
    except UsageError:
        raise ConfigError(
            f"{where}: a cap must be a whole number from 1 to {MAX_CAP}, not {value!r}"
        ) from None


def string(value: object, *, where: str) -> str:
    """A non-empty string."""
    if not isinstance(value, str):
        raise ConfigError(f"{where}: must be a string, not {kind(value)}")
    if not value:
        raise ConfigError(f"{where}: must not be empty")
    return value


def expand_home(text: str, env: Mapping[str, str]) -> Path:
    """`~` and `~/...` under $HOME from `env` (the real home when it has none); others as given."""
    if text == "~" or text.startswith("~/"):
        home = env.get("HOME")
        return Path(home + text[1:]) if home else Path(text).expanduser()
    return Path(text)
