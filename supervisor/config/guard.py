"""`[guard]`: how a turn's guard ends the work (grace, scan interval)."""

from __future__ import annotations

from typing import NamedTuple

from .schema import Checker, Key, Section, Table
from .values import duration

DEFAULT_GRACE = 5.0
DEFAULT_SCAN = 2.0

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
    ),
)


class GuardSettings(NamedTuple):
    """What `[guard]` says, in seconds (None where a value had a problem)."""

    grace: float | None
    scan: float | None


def parse_guard(c: Checker, top: Table) -> GuardSettings:
    guard = c.table(top, ("guard",))
    return GuardSettings(
        grace=c.run(("guard", "grace"), duration, guard.get("grace", DEFAULT_GRACE)),
        scan=c.run(("guard", "scan"), duration, guard.get("scan", DEFAULT_SCAN)),
    )
