"""CPU and memory so far of the turns that run now, for the page's holders table.

A turn's processes are those in the guard's session (the supervisor starts every guard in a session
of its own, and the turn's command inherits it) plus those in any process group the slot record
names (a descendant that called setsid keeps its group recorded by the guard). The guard itself
is not counted. One pass over /proc per sample, whatever the number of turns; it runs in a
worker thread, never on the page's event loop.

"So far" means the processes alive now: CPU of children already reaped is in the turn's usage at
exit (`turn.<id>.exited`), not here. Memory is the resident set summed over the processes.

Knows /proc; nothing of the supervisor or HTTP. A process that ends mid-read is skipped.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from ..caps import SlotState

_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


class Work(NamedTuple):
    turn: str
    guard_pid: int | None
    pgids: frozenset[int]


class Sample(NamedTuple):
    cpu_seconds: float
    rss_bytes: int


def _read(pid: int) -> tuple[int, int, int, int] | None:
    """(pgid, sid, cpu ticks, rss pages) of one process, None when it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split()
    # fields[0] is field 3 (state); field N is fields[N - 3]
    if len(fields) < 22 or fields[0] in (b"Z", b"X"):
        return None
    return int(fields[2]), int(fields[3]), int(fields[11]) + int(fields[12]), int(fields[21])


def sample(works: list[Work]) -> dict[str, Sample]:
    """turn id -> what its live processes use now (a turn with no process found is left out)."""
    if not works:
        return {}
    by_sid = {w.guard_pid: w.turn for w in works if w.guard_pid}
    by_pgid = {pgid: w.turn for w in works for pgid in w.pgids}
    guards = set(by_sid)
    totals: dict[str, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        if pid in guards:
            continue
        read = _read(pid)
        if read is None:
            continue
        pgid, sid, ticks, pages = read
        turn = by_sid.get(sid) or by_pgid.get(pgid)
        if turn is None:
            continue
        total = totals.setdefault(turn, [0, 0])
        total[0] += ticks
        total[1] += pages
    return {turn: Sample(t[0] / _TICKS, t[1] * _PAGE) for turn, t in totals.items()}


def works_of(slots: list[dict]) -> list[Work]:
    """The works of `ps` slots that hold a turn with a guard."""
    works = []
    for slot in slots:
        turn, pid = slot.get("turn"), slot.get("pid")
        if not isinstance(turn, str) or slot.get("state") != SlotState.HELD:
            continue
        pgids = frozenset(
            g["pgid"]
            for g in slot.get("groups") or []
            if isinstance(g, dict) and isinstance(g.get("pgid"), int)
        )
        works.append(Work(turn, pid if isinstance(pid, int) else None, pgids))
    return works
