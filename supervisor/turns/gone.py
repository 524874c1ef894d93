"""Confirmed gone: the supervisor's own judgment that a turn's work has ended, never a hint's.

`confirm_gone` is the one function that decides; the ending table (supervisor.turns.endings) releases a
slot only on its True. It is async, and that is its boundary with the event loop: anything that
waits or grows with the size of a turn runs behind it, in a worker thread: judging the recorded
groups (guardd.procs.live_groups: one pass over /proc for all of them), the sweep for escapees
(every process's environment) and ending leftover work (`reaper.end_work`, which waits a grace).
A turn with 800 groups and 1,200 processes thus costs the loop nothing while it is judged. The
one exception is constant: a turn with at most GLANCE_GROUPS groups, none with a member left and
its cgroup empty, is confirmed on the loop (a killpg(pgid, 0) per group and one read), which spares
the common end the hop to a thread.

The rule: after a hint (`guard.<turn>.gone`, guard_done False) the groups the guard recorded must
all be gone, or nothing happens. After the guard process itself ended (guard_done True), its
recorded groups are judged; when it did not end its own work (killed outright, or gave up: its
record is not `gone`), processes still marked `CCSUP_TURN=<turn>` (in this state directory's
scope, see supervisor.guards.reaper) count too; whatever lives is
ended here (SIGTERM, grace, SIGKILL) and must then be confirmed gone.

Knows guard records' groups and /proc (through guardd.procs and supervisor.guards.reaper); nothing of
slots, queues or events. `Probe` is the outside world, replaced by a fake in tests.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from guardd import procs
from guardd.procs import Group
from guardd.record import record_dir_scope, record_groups

from ..guards import containment, reaper

log = logging.getLogger("ccsup.gone")

# Up to this many recorded groups, a turn that ended cleanly is judged on the loop.
GLANCE_GROUPS = 16


class Probe:
    """How the judgment looks at the machine (real by default).

    record_dir: this state directory's guard records, whose scope marks its turns' processes."""

    def __init__(self, record_dir: str | os.PathLike | None = None):
        self.record_dir = record_dir

    @property
    def scope(self) -> str | None:
        return record_dir_scope(self.record_dir) if self.record_dir is not None else None

    def memberless(self, groups: list[Group]) -> bool:
        """Constant for a few groups: True when no group has a member at all (killpg(pgid, 0) says
        none for each, zombies included). False says nothing: `groups_alive` judges."""
        return procs.memberless(groups)

    def groups_alive(self, groups: list[Group]) -> bool:
        """Blocking, run in a thread: one pass over /proc whatever the number of groups."""
        return bool(procs.live_groups(groups))

    def cgroup_populated(self, path: str) -> bool:
        """Blocking but constant: the kernel's `populated` of the turn's cgroup."""
        return containment.cgroup_populated(path)

    def escapees(self, turn_id: str) -> bool:
        return bool(reaper.marked_processes(turn_id, self.scope))

    def end_work(
        self, groups: list[Group], turn_id: str, grace: float, cgroup: str | None = None
    ) -> bool:
        """Blocking (waits up to a grace and more): only ever called in a thread."""
        return reaper.end_work(groups, turn=turn_id, scope=self.scope, grace=grace, cgroup=cgroup)


async def confirm_gone(
    record: dict[str, Any] | None,
    turn_id: str,
    *,
    guard_done: bool,
    grace: float,
    probe: Probe,
    cgroup: str | None = None,
) -> bool:
    """True when the turn's work is confirmed gone (ended here first if the guard could not).

    cgroup: the turn's cgroup as the supervisor made it, so that it is checked even when the
    guard died before its record named it."""
    groups = record_groups(record) if record else []
    recorded = (record or {}).get("cgroup")
    cgroup = recorded if isinstance(recorded, str) and recorded else cgroup
    ended_by_guard = (record or {}).get("state") == "gone"
    sweep = guard_done and not ended_by_guard
    if not sweep and _gone_at_a_glance(probe, groups, cgroup):
        return True
    if not guard_done:
        # A hint that does not hold changes nothing.
        return not await asyncio.to_thread(_work_left, probe, groups, turn_id, False, cgroup)
    if await asyncio.to_thread(_work_left, probe, groups, turn_id, sweep, cgroup):
        log.warning("turn %s: the guard ended but its work did not; ending it now", turn_id)
        ending = (groups, turn_id, grace, cgroup) if cgroup else (groups, turn_id, grace)
        if not await asyncio.to_thread(probe.end_work, *ending):
            log.error("turn %s: work still alive; the slot stays held and is retried", turn_id)
            return False
    return True


def _gone_at_a_glance(probe: Probe, groups: list[Group], cgroup: str | None) -> bool:
    """On the loop, for the common end (a few groups, all without a member, an empty cgroup): a
    handful of syscalls, cheaper than the hop to a worker thread. False: the thread judges."""
    if len(groups) > GLANCE_GROUPS:
        return False
    if cgroup is not None and probe.cgroup_populated(cgroup):
        return False
    return probe.memberless(groups)


def _work_left(
    probe: Probe, groups: list[Group], turn_id: str, sweep: bool, cgroup: str | None = None
) -> bool:
    """Blocking (a worker thread): does the turn's cgroup hold anything (the kernel's word, checked
    again here before any release), or do recorded groups, or (sweep) marked escapees, still run?"""
    if cgroup is not None and probe.cgroup_populated(cgroup):
        return True
    return probe.groups_alive(groups) or (sweep and probe.escapees(turn_id))
