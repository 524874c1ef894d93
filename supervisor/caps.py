"""Cap keys and caps: which key may run how many turns at once, and the states a slot of a cap
can be in (`SlotState`). Pure: no I/O.

A key is `harness` or `harness:variant` (`codex`, `opencode:xai`), matching
`[A-Za-z0-9._-]+(:[A-Za-z0-9._-]+)?`, at most 128 characters. Keys starting with `_` are reserved
(`_machine` is the machine-wide slot key); no part may start with `.` (a key names a directory).

The cap of a key, first match wins: the key named in `caps`; for `harness:variant`, the bare
harness named in `caps` (each such key on its own, not shared); the harness's `default_cap`
(`[harness.X]` in the config); the global `default_cap` (1).

A cap is a whole number from 1 to MAX_CAP (1,000,000), wherever it is given (`caps`, `default_cap`,
`machine_cap`, `--caps`): a cap meant as "no limit" is written 1000000. Nothing costs in proportion
to the cap (the gate's work grows with the slots in use and the slot files present, see
supervisor.slots.gate), so the bound only keeps numbers sane: a cap of 10**20 was accepted once and
a `set(range(cap))` grew the daemon to 3.5 GiB.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from .errors import UsageError

MACHINE_KEY = "_machine"


class SlotState(enum.StrEnum):
    """How one slot of a cap stands, as the slot gate judges it and `ps`, the page and the metrics
    say it (a StrEnum: in JSON and text each is its own string). Every state but FREE is taken:
    it counts against the cap."""

    FREE = "free"
    RESERVED = "reserved"  # locked, no work recorded (a reservation, or a grant before its guard)
    HELD = "held"  # locked, its work recorded
    ORPHANED = "orphaned"  # its holder died while its work lives: counted, and reaped
    UNREADABLE = "unreadable"  # its record or directory cannot be read: never free

    @property
    def taken(self) -> bool:
        return self is not SlotState.FREE


TAKEN = frozenset(state for state in SlotState if state.taken)

MAX_KEY_LENGTH = 128
MAX_CAP = 1_000_000  # see the module docstring
_OVER = f"is over the maximum cap, {MAX_CAP} (write that for no limit)"
_KEY = re.compile(r"[A-Za-z0-9._-]+(:[A-Za-z0-9._-]+)?\Z")
_NUMBER = re.compile(r"-?[0-9]+\Z")


def key_problem(key: object, *, reserved_ok: bool = False) -> str | None:
    """Why `key` is not a valid cap key, or None when it is."""
    if not isinstance(key, str):
        return f"a cap key must be a string, not {type(key).__name__}"
    if not key:
        return "a cap key must not be empty"
    if len(key) > MAX_KEY_LENGTH:
        return f"a cap key is at most {MAX_KEY_LENGTH} characters (this one has {len(key)})"
    if not _KEY.match(key):
        return "a cap key is `harness` or `harness:variant` of letters, digits, '.', '_' and '-'"
    if any(part.startswith(".") for part in key.split(":")):
        return "no part of a cap key may start with '.'"
    if key.startswith("_") and not (reserved_ok and key == MACHINE_KEY):
        return "keys starting with '_' are reserved"
    return None


def check_key(key: object, *, reserved_ok: bool = False, name: str = "cap key") -> str:
    """The key, or UsageError "bad <name> <key>: <problem>" (a long key shown cut short)."""
    problem = key_problem(key, reserved_ok=reserved_ok)
    if problem:
        shown = repr(key[:140]) if isinstance(key, str) else f"of type {type(key).__name__}"
        raise UsageError(f"bad {name} {shown}: {problem}")
    assert isinstance(key, str)  # key_problem refuses anything else
    return key


def cap_problem(value: object) -> str | None:
    """Why `value` is not a cap (a whole number from 1 to MAX_CAP; a bool is none), or None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{_shown(value)} is not a whole number"
    if value < 1:
        return f"{value} must be at least 1"
    if value > MAX_CAP:
        return f"{_shown(value)} {_OVER}"
    return None


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_cap(name: str, value: object) -> int:
    """The cap, or UsageError "bad cap for <name>: <problem>"."""
    problem = cap_problem(value)
    if problem:
        raise UsageError(f"bad cap for {name!r}: {problem}")
    assert isinstance(value, int)
    return value


def check_caps_table(table: object) -> dict[str, int]:
    """Validate a {key: cap} mapping (from TOML or the command line)."""
    if not isinstance(table, Mapping):
        raise UsageError(f"caps must be a table of key = cap, not {table!r}")
    return {check_key(k): check_cap(k, v) for k, v in table.items()}


def parse_caps_option(text: str) -> dict[str, int]:
    """Parse `codex=2,opencode:xai=1` (spaces allowed around items)."""
    caps: dict[str, int] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise UsageError(f"bad caps item {item!r}: write it as key=N, e.g. codex=2")
        # int() alone would take "2_0", "+2" and non-ASCII digits; a cap is plain decimal digits.
        if not _NUMBER.match(value):
            raise UsageError(f"bad caps item {item!r}: {value!r} is not a whole number")
        check_key(key)
        if key in caps:
            raise UsageError(f"bad caps item {item!r}: {key!r} is given twice")
        if len(value) > 12:  # far out of range (and int() refuses over 4300 digits)
            shown = value if len(value) <= 40 else value[:37] + "..."
            problem = "must be at least 1" if value.startswith("-") else _OVER
            raise UsageError(f"bad cap for {key!r}: {shown} {problem}")
        caps[key] = check_cap(key, int(value))
    return caps


@dataclass(frozen=True)
class Caps:
    default_cap: int = 1
    caps: Mapping[str, int] = field(default_factory=dict)
    harness_default: Mapping[str, int] = field(default_factory=dict)
    machine_cap: int | None = None
    min_free_memory: int | None = None  # bytes

    def __post_init__(self):
        object.__setattr__(self, "caps", MappingProxyType(dict(self.caps)))
        object.__setattr__(self, "harness_default", MappingProxyType(dict(self.harness_default)))

    def cap_for(self, key: str) -> int:
        if key == MACHINE_KEY:
            if self.machine_cap is None:
                raise KeyError("no machine cap is configured")
            return self.machine_cap
        if key in self.caps:
            return self.caps[key]
        harness, sep, _ = key.partition(":")
        if sep and harness in self.caps:
            return self.caps[harness]
        if harness in self.harness_default:
            return self.harness_default[harness]
        return self.default_cap

    def with_caps(self, extra: Mapping[str, int]) -> Caps:
        """These caps with `extra` (e.g. from --caps) winning over the file's."""
        merged = dict(self.caps)
        merged.update(extra)
        return Caps(
            self.default_cap, merged, self.harness_default, self.machine_cap, self.min_free_memory
        )

    def configured_keys(self) -> list[str]:
        keys = list(self.caps)
        if self.machine_cap is not None:
            keys.append(MACHINE_KEY)
        return keys


# Where a key's cap comes from, as `ccsup status` names it.
CAP_SOURCES = ("--caps", "config", "harness default", "default")


def cap_sources(
    file_caps: Caps, override: Mapping[str, int], keys: list[str]
) -> list[dict[str, object]]:
    """For each of `keys`: `{"key", "cap", "source", "from"}`, the cap in force and the rule that
    gave it (`source` one of CAP_SOURCES; `from` the name of the matching entry: the key, or its
    bare harness). `file_caps` are the config file's caps, `override` the --caps of `ccsup
    start`, which win over the file's (the order of Caps.cap_for)."""
    in_force = file_caps.with_caps(override)
    out: list[dict[str, object]] = []
    for key in keys:
        if key == MACHINE_KEY:
            continue
        harness, sep, _ = key.partition(":")
        source, origin = "default", "default_cap"
        for name in (key, harness) if sep else (key,):
            if name in override:
                source, origin = "--caps", name
                break
            if name in file_caps.caps:
                source, origin = "config", name
                break
        else:
            if harness in file_caps.harness_default:
                source, origin = "harness default", f"harness.{harness}.default_cap"
        out.append({"key": key, "cap": in_force.cap_for(key), "source": source, "from": origin})
    return out
