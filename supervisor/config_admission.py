"""The configuration of admission: `[slots]` max_pause, rates, max_runtime, expiring_notice,
fairness, and the `[pause_on.<key>]` tables. Pure: parses what the config's checker hands it.

```toml
[slots]
max_pause = "1h"                               # no pause ends later than now + this
rates = { codex = "20/min", "opencode:xai" = "3/10s" }   # grants per window, per key
max_runtime = { codex = "2h" }                 # a turn of the key is stopped past this
expiring_notice = "1m"                         # turn.<id>.expiring this long before
fairness = "fifo"                              # or "session"

[pause_on.codex]                               # a turn's own stderr or exit pauses its key
stderr = "(?i)rate.?limit|429"
exit_codes = [75]
for = "60s"                                    # or Retry-After: N from the matched stderr
```

Keys of `rates`, `max_runtime` and `pause_on` are cap keys or bare harness names (which then
apply to each key of the harness not named itself). Every problem is reported with its dotted
key and line by the config's checker. Knows these keys; the rest of the config is config.py's.
"""

from __future__ import annotations

import re
from typing import Any

from .admission_policy import AdmissionSettings
from .caps import key_problem
from .errors import ConfigError
from .fairness import FAIRNESS
from .pause_on import PauseRule
from .pauses import DEFAULT_MAX_PAUSE
from .rates import Rate, parse_rate
from .runtime_limits import DEFAULT_EXPIRING_NOTICE

SLOTS_KEYS = frozenset({"max_pause", "rates", "max_runtime", "expiring_notice", "fairness"})
PAUSE_ON_KEYS = frozenset({"stderr", "exit_codes", "for"})
DEFAULT_PAUSE_ON_FOR = 60.0


def parse_admission(c: Any, top: dict, slots: dict, parse_duration: Any) -> AdmissionSettings:
    """`c` is config's checker (add/run/table); `parse_duration(value, where=)` its durations."""
    max_pause = c.run(
        ("slots", "max_pause"), parse_duration, slots.get("max_pause", DEFAULT_MAX_PAUSE)
    )
    notice = c.run(
        ("slots", "expiring_notice"),
        parse_duration,
        slots.get("expiring_notice", DEFAULT_EXPIRING_NOTICE),
    )
    fairness = slots.get("fairness", "fifo")
    if fairness not in FAIRNESS:
        c.add(("slots", "fairness"), f'must be "fifo" or "session", not {fairness!r}')
        fairness = "fifo"

    def rate(value: object, *, where: str) -> Rate:
        try:
            return parse_rate(value, lambda text: parse_duration(text, where=where))
        except ValueError as e:
            raise ConfigError(f"{where}: {e}") from None

    rates = _key_table(c, slots, "rates", rate)
    max_runtime = _key_table(c, slots, "max_runtime", parse_duration)
    return AdmissionSettings(
        max_pause=max_pause or DEFAULT_MAX_PAUSE,
        rates=rates,
        max_runtime=max_runtime,
        expiring_notice=notice or DEFAULT_EXPIRING_NOTICE,
        fairness=fairness,
        pause_on=_pause_on(c, top, parse_duration),
    )


def _key_table(c: Any, slots: dict, name: str, check: Any) -> dict:
    table = slots.get(name, {})
    if not isinstance(table, dict):
        c.add(("slots", name), "must be a table of key = value")
        return {}
    out = {}
    for key, value in table.items():
        path = ("slots", name, key)
        problem = key_problem(key)
        if problem:
            c.add(path, f"bad cap key: {problem}")
            continue
        parsed = c.run(path, check, value)
        if parsed is not None:
            out[key] = parsed
    return out


def _pause_on(c: Any, top: dict, parse_duration: Any) -> dict[str, PauseRule]:
    section = top.get("pause_on", {})
    if not isinstance(section, dict):
        c.add(("pause_on",), "must be a table of [pause_on.<key>] tables")
        return {}
    rules = {}
    for key, raw in section.items():
        path = ("pause_on", key)
        problem = key_problem(key)
        if problem:
            c.add(path, f"bad cap key: {problem}")
            continue
        table = c.table(section, path, set(PAUSE_ON_KEYS))
        if not isinstance(raw, dict):
            continue  # reported by c.table
        pattern = None
        if "stderr" in table:
            pattern = c.run(path + ("stderr",), _pattern, table["stderr"])
        codes = c.run(path + ("exit_codes",), _exit_codes, table.get("exit_codes", []))
        length = c.run(path + ("for",), parse_duration, table.get("for", DEFAULT_PAUSE_ON_FOR))
        if pattern is None and not codes and "stderr" not in table:
            c.add(path, "needs `stderr` (a pattern) or `exit_codes` (a list): nothing would match")
            continue
        rules[key] = PauseRule(key, pattern, frozenset(codes or ()), length or DEFAULT_PAUSE_ON_FOR)
    return rules


def _pattern(value: object, *, where: str) -> re.Pattern[str]:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: must be a regular expression (a non-empty string)")
    try:
        return re.compile(value)
    except re.error as e:
        raise ConfigError(f"{where}: {value!r} is not a valid regular expression ({e})") from None


def _exit_codes(value: object, *, where: str) -> list[int]:
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 255 for v in value
    ):
        raise ConfigError(f"{where}: must be a list of exit codes from 0 to 255, not {value!r}")
    return list(value)
