"""Confirmed gone: the supervisor's own judgment that a turn's work has ended, never a hint's.

`confirm_gone` is the one function that decides; the ending table (supervisor.endings) releases a
slot only on its True. It is async, and that is its boundary with the event loop: anything that
waits or grows with the size of a turn belongs behind it, in a thread. Today ending leftover work
(`reaper.end_work`, which waits a grace) runs in a thread; judging the recorded groups and the
sweep for escapees still run on the loop (a pass over /proc per group: moving that into the
thread, with one /proc snapshot, is the next step).

The rule: after a hint (`guard.<turn>.gone`, guard_done False) the groups the guard recorded must
all be gone, or nothing happens. After the guard process itself ended (guard_done True), its
recorded groups are judged; when it did not end its own work (killed outright, or gave up: its
record is not `gone`), processes still marked `CCSUP_TURN=<turn>` count too; whatever lives is
ended here (SIGTERM, grace, SIGKILL) and must then be confirmed gone.

Knows guard records' groups and /proc (through guardd.procs and supervisor.reaper); nothing of
slots, queues or events. `Probe` is the outside world, replaced by a fake in tests.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from guardd import procs
from guardd.procs import Group
from guardd.record import record_groups

from . import reaper

log = logging.getLogger("ccsup.gone")


class Probe:
    """How the judgment looks at the machine (real by default)."""

    def groups_alive(self, groups: list[Group]) -> bool:
        return any(procs.group_alive(g) for g in groups)

    def escapees(self, turn_id: str) -> bool:
        return bool(procs.processes_with_env(reaper.TURN_ENV, turn_id))

    def end_work(self, groups: list[Group], turn_id: str, grace: float) -> bool:
        """Blocking (waits up to a grace and more): only ever called in a thread."""
        return reaper.end_work(groups, turn=turn_id, grace=grace)


async def confirm_gone(
    record: dict[str, Any] | None,
    turn_id: str,
    *,
    guard_done: bool,
    grace: float,
    probe: Probe,
) -> bool:
    """True when the turn's work is confirmed gone (ended here first if the guard could not)."""
    groups = record_groups(record) if record else []
    if not guard_done:
        return not probe.groups_alive(groups)  # a hint that does not hold changes nothing
    ended_by_guard = (record or {}).get("state") == "gone"
    if probe.groups_alive(groups) or (not ended_by_guard and probe.escapees(turn_id)):
        log.warning("turn %s: the guard ended but its work did not; ending it now", turn_id)
        if not await asyncio.to_thread(probe.end_work, groups, turn_id, grace):
            log.error("turn %s: work still alive; the slot stays held and is retried", turn_id)
            return False
    return True
