"""`[memory]`: admission by the machine's room (budget, reserve, estimate) and the pressure brake.

```toml
[memory]
budget = "auto"                   # or a size ("12GiB"): what ccsup's turns may use together
reserve = "1GiB"                  # with "auto": MemAvailable less this is the room
estimate = { codex = "1.2GiB" }   # a key's peak until it has peaks of its own in the history
pressure = 0.10                   # PSI memory `some avg10` share at which nothing is granted
```

No `budget`: turns are admitted by their caps alone (the brake still holds). A size larger than
the machine's memory (MemTotal, read once when the file is parsed: the one read this module does),
zero, a negative size, an estimate for a key named nowhere in the configuration (`[slots] caps`,
a bare harness there, `[cluster] caps`), and a `pressure` outside 0-1 are errors naming the key.
`pressure = 0` turns the brake off. What acts on these is supervisor.admission.room.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from ..caps import key_problem
from ..errors import ConfigError
from .schema import Checker, Key, Section, Table, per_key
from .values import size

AUTO = "auto"
DEFAULT_RESERVE = 1 << 30
DEFAULT_PRESSURE = 0.10

SECTION = Section(
    ("memory",),
    "The machine's room: a turn is granted only when its key's predicted peak memory fits\n"
    "(the 90th percentile of the key's last 20 peaks, else its estimate), and nothing is granted\n"
    "while the kernel reports memory pressure (PSI). Running turns are never ended for memory.",
    (
        Key(
            "budget",
            "auto",
            'What the running turns may use together: a size ("12GiB"), or "auto" (MemAvailable\n'
            "now, less reserve, less what the running turns are still predicted to grow).\n"
            "Default: no budget (turns are admitted by their caps alone).",
            example=True,
        ),
        Key(
            "reserve",
            "1GiB",
            'With budget = "auto": memory kept free for everything else on the machine.',
        ),
        Key(
            "estimate",
            {"codex": "1.2GiB"},
            "A key's peak memory until its own peaks are in the history (keys of [slots] caps).",
            example=True,
        ),
        Key(
            "pressure",
            DEFAULT_PRESSURE,
            "PSI memory `some avg10` share (0-1) at or above which nothing is granted; 0: off.",
        ),
    ),
)


@dataclass(frozen=True)
class MemorySettings:
    """What `[memory]` says: budget in bytes, "auto", or None (no budget)."""

    budget: int | str | None = None
    reserve: int = DEFAULT_RESERVE
    estimate: dict[str, int] = field(default_factory=dict)
    pressure: float = DEFAULT_PRESSURE


def machine_memory() -> int | None:
    """MemTotal in bytes, None when /proc/meminfo cannot be read."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _positive_size(value: object, *, where: str) -> int:
    got = size(value, where=where)
    if got == 0:
        raise ConfigError(f"{where}: a size must be more than zero, not {value!r}")
    return got


def _share(value: object, *, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where}: a share is a number from 0 to 1, not {value!r}")
    if not 0 <= value <= 1:
        raise ConfigError(f"{where}: a share is from 0 to 1, not {value!r}")
    return float(value)


def parse_memory(
    c: Checker,
    top: Table,
    known_keys: Collection[str],
    total: Callable[[], int | None] = machine_memory,
) -> MemorySettings:
    """`known_keys`: the keys (and bare harness names) the rest of the file names."""
    table = c.table(top, ("memory",))
    budget: int | str | None = None
    if "budget" in table:
        raw = table["budget"]
        if raw == AUTO:
            budget = AUTO
        else:
            budget = c.run(("memory", "budget"), _positive_size, raw)
            machine = total() if budget is not None else None
            if budget is not None and machine is not None and budget > machine:
                c.add(
                    ("memory", "budget"),
                    f"{raw!r} is more than this machine's memory ({machine} bytes)",
                )
    reserve = c.run(("memory", "reserve"), size, table.get("reserve", DEFAULT_RESERVE))
    pressure = c.run(("memory", "pressure"), _share, table.get("pressure", DEFAULT_PRESSURE))
    estimate: dict[str, int] = {}
    for key, path, value in per_key(
        c.add, table, ("memory", "estimate"), holds='key = "size"', check_key=key_problem
    ):
        bare = key.split(":", 1)[0]
        if key not in known_keys and bare not in known_keys:
            c.add(path, f"unknown key {key!r}: name it in [slots] caps (or [cluster] caps) first")
            continue
        checked = c.run(path, _positive_size, value)
        if checked is not None:
            estimate[key] = checked
    return MemorySettings(
        budget=budget,
        reserve=DEFAULT_RESERVE if reserve is None else reserve,
        estimate=estimate,
        pressure=DEFAULT_PRESSURE if pressure is None else pressure,
    )


def estimate_for(settings: MemorySettings, key: str) -> int | None:
    """The configured estimate of a key: its own, else its bare harness's."""
    if key in settings.estimate:
        return settings.estimate[key]
    return settings.estimate.get(key.split(":", 1)[0])
