"""`[limits.<key>]`: resource limits for a key's turns, written to cgroups where a controller is
delegated (supervisor.guards.containment); where it is not, `config check`, `start` and `status` say so
plainly: a limit is never silently ignored.

`memory_max` (a size, "4GiB"), `pids_max` (a whole number >= 1), `cpu_max` ("200%": two CPUs'
worth), `scope` ("turn": each turn's own cgroup gets the limit; "key": one parent cgroup of the
key, shared by all its turns, gets it: a ceiling for the key as a whole, where N turns with a
per-turn limit could take N times it). A tight per-turn memory limit can make programs that size
themselves from the cgroup (Node.js sizes its heap from it) shrink and fail: leave room.
Pure: parsing only.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..caps import key_problem
from .schema import Checker, Key, Section, Table, per_key
from .values import cap, size

SECTION = Section(
    ("limits", "*"),
    "Resource limits of a key's turns (cgroup v2, where the controller is delegated).",
    (
        Key("memory_max", "4GiB", "memory.max of each turn (or of the key, scope = key).", True),
        Key("pids_max", 512, "pids.max: processes and threads at once.", example=True),
        Key("cpu_max", "200%", "cpu.max: 100% is one CPU's worth.", example=True),
        Key("scope", "turn", '"turn" (each turn) or "key" (all its turns together).', True),
    ),
    example=True,
    example_name="codex",
)

SCOPES = ("turn", "key")
CPU_PERIOD_US = 100_000


@dataclass(frozen=True)
class Limits:
    """`[limits.<key>]`: None where not set."""

    key: str
    memory_max: int | None = None  # bytes
    pids_max: int | None = None
    cpu_max: int | None = None  # percent of one CPU
    scope: str = "turn"

    def files(self) -> dict[str, str]:
        """The cgroup files and values these limits write (memory.max, pids.max, cpu.max)."""
        found = {}
        if self.memory_max is not None:
            found["memory.max"] = str(self.memory_max)
        if self.pids_max is not None:
            found["pids.max"] = str(self.pids_max)
        if self.cpu_max is not None:
            found["cpu.max"] = f"{self.cpu_max * CPU_PERIOD_US // 100} {CPU_PERIOD_US}"
        return found


def percent(value: object, *, where: str) -> int:
    from ..errors import ConfigError

    if isinstance(value, str) and value.endswith("%") and value[:-1].strip().isdigit():
        number = int(value[:-1])
        if number >= 1:
            return number
    raise ConfigError(f'{where}: must be a percentage of one CPU like "200%", not {value!r}')


def scope(value: object, *, where: str) -> str:
    from ..errors import ConfigError

    if value in SCOPES:
        return str(value)
    raise ConfigError(f'{where}: must be "turn" or "key", not {value!r}')


def parse_limits(c: Checker, top: Table) -> dict[str, Limits]:
    limits = {}
    for key, path, _ in per_key(
        c.add,
        top,
        ("limits",),
        holds="[limits.<key>] tables",
        check_key=key_problem,
        bad_key="bad key",
    ):
        entry = c.table(top["limits"], path, schema=SECTION.path)
        values = {
            "memory_max": c.run(path + ("memory_max",), size, entry["memory_max"])
            if "memory_max" in entry
            else None,
            "pids_max": c.run(path + ("pids_max",), cap, entry["pids_max"])
            if "pids_max" in entry
            else None,
            "cpu_max": c.run(path + ("cpu_max",), percent, entry["cpu_max"])
            if "cpu_max" in entry
            else None,
        }
        chosen = c.run(path + ("scope",), scope, entry.get("scope", "turn")) or "turn"
        limits[key] = Limits(key, scope=chosen, **values)
    return limits
