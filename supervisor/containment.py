"""Judging a turn's work off the event loop: is anything the turn started still running?

Design note. Whether a turn's work is gone is judged from its recorded groups (guardd.procs.
live_groups: a killpg(pgid, 0) per group, then one pass over /proc for those that still have a
member) and, when the guard did not end its own work, a sweep of every process's environment for
the turn's CCSUP_TURN marker. Both grow with the size of the turn (800 groups, 1,200 processes)
or of the machine, so the supervisor never runs them on its event loop: they run in a worker
thread (asyncio.to_thread) and the loop awaits the answer, answering `status` and everyone else
meanwhile. The thread only reads /proc; it changes nothing, so running it twice, or abandoning it
half-way, is harmless.

The groups a guard recorded are read the same way: a record of 800 groups costs a few ms to
parse, so a worker thread reads it.

Knows group liveness, the turn marker and guard records (from guardd and supervisor.reaper);
nothing of slots or the bus. Holds no state.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence

from guardd import procs
from guardd.procs import Group
from guardd.record import RecordError, read_json, record_groups

from .reaper import TURN_ENV


def work_running_now(groups: Sequence[Group], turn: str, *, sweep: bool) -> bool:
    """Blocking: does any recorded group run anything, or (sweep) any process carry the turn's
    marker? Call it from a worker thread (see work_running)."""
    if procs.live_groups(groups):
        return True
    return sweep and bool(procs.processes_with_env(TURN_ENV, turn))


async def work_running(groups: Sequence[Group], turn: str, *, sweep: bool) -> bool:
    """work_running_now in a worker thread: the event loop keeps serving while /proc is read."""
    return await asyncio.to_thread(work_running_now, list(groups), turn, sweep=sweep)


def recorded_groups(record_path: str | os.PathLike) -> list[Group] | None:
    """Blocking: the groups a guard record names (own group first), None when it cannot be read
    (not written yet, or being replaced: the next look finds it). Run it in a worker thread: a
    big turn's record holds hundreds of groups."""
    try:
        return record_groups(read_json(record_path))
    except (OSError, RecordError, KeyError, TypeError, ValueError, AttributeError):
        return None
