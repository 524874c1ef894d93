"""The configuration of admission: `[slots]` max_pause, rates, max_runtime, expiring_notice,
fairness, the `[pause_on.<key>]` tables, and `[quota]` (supervisor.config.quota). Pure: parses what the config's checker hands it.

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
key and line by the config's checker. The new `[slots]` keys are `SLOTS_KEYS`, added to
`slots.SECTION` (so they are known and `config init` documents them); `[pause_on.<key>]` is
`PAUSE_ON_SECTION`, a table of named tables as `[harness.<name>]` is.

What the configuration says about admission, as values: `[slots]` max_pause, rates,
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

from ..caps import key_problem
from ..errors import ConfigError
from .quota import DEFAULT_HOLD_AT, READERS, parse_quota
from .schema import Check, Checker, Key, Section, Table, per_key
from .values import duration as parse_duration

DEFAULT_MAX_PAUSE = 3600.0  # [slots] max_pause: no pause ends later than now + this
DEFAULT_EXPIRING_NOTICE = 60.0  # [slots] expiring_notice
FAIRNESS = ("fifo", "session")  # [slots] fairness (supervisor.turns.fairness)

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
    """One `[pause_on.<key>]` table (supervisor.admission.pause_on applies it)."""

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
    hold_at: float = DEFAULT_HOLD_AT  # [quota] hold_at (supervisor.config.quota)
    quota_read: frozenset[str] = frozenset(READERS)  # [quota] read


DEFAULT_PAUSE_ON_FOR = 60.0

SLOTS_KEYS = (
    Key(
        "max_pause",
        "1h",
        "No pause of a key ends later than now + this (ccsup pause, request.pause, pause_on).",
    ),
    Key(
        "rates",
        {"codex": "20/min", "opencode:xai": "3/10s"},
        'Start rates: at most N grants of the key in any window ("N/min", "N/10s"); a bare\n'
        "harness name gives that rate to each of its keys not named itself.",
        example=True,
    ),
    Key(
        "max_runtime",
        {"codex": "2h"},
        "A turn of the key is stopped past this (as a cancel stops it; exited says\n"
        'reason "timeout"); a turn\'s own `timeout` wins when smaller.',
        example=True,
    ),
    Key(
        "expiring_notice",
        "1m",
        "turn.<id>.expiring is published this long before a runtime limit stops the turn.",
    ),
    Key(
        "fairness",
        "fifo",
        '"fifo": waiters in request order; "session": round-robin across the holders\'\n'
        "sessions, FIFO within one.",
    ),
)

PAUSE_ON_SECTION = Section(
    ("pause_on", "*"),
    "A turn of the key (or of every key of a bare harness name) whose stderr matches `stderr`,\n"
    "or that exits with one of `exit_codes`, pauses its own key for `for` (or for the\n"
    "`Retry-After: N` in its stderr).",
    (
        Key("stderr", "(?i)rate.?limit|429", "A regular expression (Python's).", example=True),
        Key("exit_codes", [75], "Exit codes that pause the key.", example=True),
        Key("for", "60s", "How long, when the stderr gives no Retry-After.", example=True),
    ),
    example=True,
    example_name="codex",
)


def parse_admission(c: Checker, top: Table) -> AdmissionSettings:
    """The admission keys of `[slots]` (whose table `parse_slots` already checked) and every
    `[pause_on.<key>]`."""
    slots = top.get("slots", {})
    if not isinstance(slots, dict):
        slots = {}  # reported by parse_slots
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
    hold_at, quota_read = parse_quota(c, top)
    return AdmissionSettings(
        max_pause=max_pause or DEFAULT_MAX_PAUSE,
        rates=rates,
        max_runtime=max_runtime,
        expiring_notice=notice or DEFAULT_EXPIRING_NOTICE,
        fairness=fairness,
        pause_on=_pause_on(c, top),
        hold_at=hold_at,
        quota_read=quota_read,
    )


def _key_table(c: Checker, slots: Table, name: str, check: Check) -> dict:
    out = {}
    for key, path, value in per_key(
        c.add, slots, ("slots", name), holds="key = value", check_key=key_problem
    ):
        parsed = c.run(path, check, value)
        if parsed is not None:
            out[key] = parsed
    return out


def _pause_on(c: Checker, top: Table) -> dict[str, PauseRule]:
    rules = {}
    for key, path, raw in per_key(
        c.add, top, ("pause_on",), holds="[pause_on.<key>] tables", check_key=key_problem
    ):
        table = c.table(top["pause_on"], path, schema=PAUSE_ON_SECTION.path)
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
