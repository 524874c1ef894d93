"""`[guard]`: how a turn's guard ends the work (grace, scan interval, cgroup), and how long it
waits to be adopted when its supervisor is gone (adopt_within; supervisor.turns.adopt)."""

from __future__ import annotations

from typing import NamedTuple

from ..errors import ConfigError
from .schema import Checker, Key, Section, Table
from .values import duration, duration_or_zero

DEFAULT_GRACE = 5.0
DEFAULT_SCAN = 2.0
DEFAULT_ADOPT_WITHIN = 30.0

SECTION = Section(
    ("guard",),
    "How a turn's guard ends the work.",
    (
        Key("grace", "5s", "Between SIGTERM and SIGKILL when a turn is stopped."),
        Key(
            "scan",
            "2s",
            "How often the guard scans for new process groups of the turn's descendants.",
        ),
        Key(
            "cgroup",
            "auto",
            'A cgroup per turn: "auto" (if cgroup2 is writable), "off", or a cgroup2 path.',
        ),
        Key(
            "adopt_within",
            "30s",
            'How long a turn runs on when its supervisor is gone, waiting to be adopted ("0s": not).',
        ),
    ),
)

DEFAULT_CGROUP = "auto"


class GuardSettings(NamedTuple):
    """What `[guard]` says, in seconds (None where a value had a problem)."""

    grace: float | None
    scan: float | None
    cgroup: str | None = DEFAULT_CGROUP
    adopt_within: float | None = DEFAULT_ADOPT_WITHIN


def parse_guard(c: Checker, top: Table) -> GuardSettings:
    guard = c.table(top, ("guard",))
    return GuardSettings(
        grace=c.run(("guard", "grace"), duration, guard.get("grace", DEFAULT_GRACE)),
        scan=c.run(("guard", "scan"), duration, guard.get("scan", DEFAULT_SCAN)),
        cgroup=c.run(("guard", "cgroup"), cgroup_setting, guard.get("cgroup", DEFAULT_CGROUP)),
        adopt_within=c.run(
            ("guard", "adopt_within"),
            duration_or_zero,
            guard.get("adopt_within", DEFAULT_ADOPT_WITHIN),
        ),
    )


def cgroup_setting(value: object, where: str) -> str:
    """`auto`, `off`, or an absolute path (whether that path is usable is checked where the
    machine is looked at: `config check` and `start`, see supervisor.guards.containment)."""
    if not isinstance(value, str):
        raise ConfigError(f'{where}: must be "auto", "off" or an absolute path, not {value!r}')
    if value in ("auto", "off") or value.startswith("/"):
        return value.rstrip("/") or "/"
    raise ConfigError(f'{where}: must be "auto", "off" or an absolute path, not {value!r}')
