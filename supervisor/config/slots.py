"""`[slots]`: the machine-wide gate's caps, reservation time, machine cap and memory floor."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple

from ..caps import key_problem
from .admission import SLOTS_KEYS
from .schema import Checker, Key, Section, Table, per_key
from .values import cap, duration, size

DEFAULT_CAP = 1
DEFAULT_RESERVATION_TTL = 60.0
TTL_ENV = "CCSUP_RESERVATION_TTL_MS"

SECTION = Section(
    ("slots",),
    "The machine-wide gate: how many turns of a cap key run at once.",
    (
        Key(
            "default_cap",
            DEFAULT_CAP,
            "The cap of a key that neither `caps` nor its harness's default_cap names (>= 1).",
        ),
        Key(
            "reservation_ttl",
            "60s",
            "How long a reservation holds its slot before a turn binds it\n"
            "($CCSUP_RESERVATION_TTL_MS overrides it, for tests).",
        ),
        Key(
            "machine_cap",
            8,
            "At most this many turns of all keys together (default: no machine cap).",
            example=True,
        ),
        Key(
            "min_free_memory",
            "1GiB",
            "Grant no new turn while less memory than this is available\n(default: no floor).",
            example=True,
        ),
        Key(
            "caps",
            {"codex": 2, "opencode:xai": 1, "opencode": 3, "claude:work": 1, "claude:home": 1},
            "Caps by key. A bare harness name (opencode = 3) gives that cap to every opencode:* key\n"
            "not named itself, each key on its own. Keys are `harness` or `harness:variant`.",
            example=True,
        ),
        *SLOTS_KEYS,  # admission: pauses, start rates, runtime limits, fairness (admission.py)
    ),
)


class Slots(NamedTuple):
    """What `[slots]` says (None where a value had a problem; then parse raises anyway)."""

    default_cap: int | None
    reservation_ttl: float | None  # seconds; $CCSUP_RESERVATION_TTL_MS already applied
    machine_cap: int | None
    min_free_memory: int | None
    caps: dict[str, int]


def parse_slots(c: Checker, top: Table, env: Mapping[str, str]) -> Slots:
    slots = c.table(top, ("slots",))
    default_cap = c.run(("slots", "default_cap"), cap, slots.get("default_cap", DEFAULT_CAP))
    ttl = c.run(
        ("slots", "reservation_ttl"),
        duration,
        slots.get("reservation_ttl", DEFAULT_RESERVATION_TTL),
    )
    machine_cap = (
        c.run(("slots", "machine_cap"), cap, slots["machine_cap"])
        if "machine_cap" in slots
        else None
    )
    min_free = (
        c.run(("slots", "min_free_memory"), size, slots["min_free_memory"])
        if "min_free_memory" in slots
        else None
    )
    caps: dict[str, int] = {}
    for key, path, value in per_key(
        c.add, slots, ("slots", "caps"), holds="key = cap", check_key=key_problem
    ):
        checked = c.run(path, cap, value)
        if checked is not None:
            caps[key] = checked
    return Slots(default_cap, _ttl_from_env(c, env, ttl), machine_cap, min_free, caps)


def _ttl_from_env(c: Checker, env: Mapping[str, str], ttl: float | None) -> float | None:
    """$CCSUP_RESERVATION_TTL_MS (milliseconds, for tests) wins over reservation_ttl."""
    if TTL_ENV not in env:
        return ttl
    raw = env[TTL_ENV]
    try:
        ms = float(raw)
    except ValueError:
        ms = float("nan")
    if not math.isfinite(ms) or ms <= 0:
        c.add_outside(
            "environment", f"${TTL_ENV}", f"must be a number of milliseconds > 0, not {raw!r}"
        )
        return ttl
    return ms / 1000.0
