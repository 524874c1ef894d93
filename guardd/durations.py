"""Durations, one grammar for the guard's options and ccsup's configuration.

A duration is a number of seconds (`0.5`, `2`) or a number with a unit, `ms`, `s`, `m` or `h`
(`500ms`, `2s`, `1m`, `1h`); case and spaces around the unit do not matter. The number is plain
decimal digits with at most one point: no sign, no exponent, no `inf`. What range is allowed
(the guard takes a grace of 0, the configuration wants more than zero) is the caller's to say.

Pure and standard library only, and no `re`: the guard's start pays for every import.
"""

from __future__ import annotations

_UNITS = (("ms", 0.001), ("s", 1.0), ("m", 60.0), ("h", 3600.0))  # "ms" before "s" and "m"
_NUMBER_CHARS = frozenset("0123456789.")


def parse_duration(text: str) -> float:
    """Seconds from a duration's text (>= 0; infinite only for an absurdly long number).

    ValueError when the text is not a duration.
    """
    value, scale = text.strip().lower(), 1.0
    for unit, factor in _UNITS:
        if value.endswith(unit):
            value, scale = value[: -len(unit)].rstrip(), factor
            break
    if not value or value == "." or value.count(".") > 1 or not _NUMBER_CHARS.issuperset(value):
        raise ValueError(f"{text!r} is not a duration (like 0.5, 500ms, 2s, 1m)")
    return float(value) * scale
