"""The memory a turn's whole tree uses now, sampled at the guard's scans, and its peak.

Design note. Where the turn's cgroup has the memory controller, the kernel keeps both figures
(memory.current, memory.peak) and nothing here runs (guardd.usage reads them). Else the guard
samples: the sum over the processes one scan found of each one's memory, and the peak is the
largest such sum over the scans. A process's memory is its PSS (proportional set size: a page
shared by N processes counts 1/N in each), so twenty workers forked from one parent, or sharing one
interpreter's libraries, add up to what the machine really gives them, where RSS would count the
shared pages twenty times.

PSS comes from /proc/<pid>/smaps_rollup, and reading it walks the process's page tables: about
25 us for a small process and tens of milliseconds for one of a gigabyte, measured here. Reading it
for every process at every scan would cost 2,000 processes 50 ms a scan (2.5 % of a core at the
2 s default), so it is read once per process and again only when the process's RSS has moved by
half (an exec, a big allocation), and never for one past LARGE (its shared part is small beside
it; its RSS serves). Between reads a process counts its last PSS plus how far its RSS moved since
(growth is private memory, which PSS counts whole). RSS itself comes from /proc/<pid>/statm
(kernel counters: under 2 us, held open and re-read with pread as guardd.scan does for `stat`).
The smaps_rollup reads of one sample stop after PSS_BUDGET seconds of CPU; the processes left
count their RSS less its shared part (file-backed and shmem pages, statm's third field: near their
PSS for most processes, which share little but those) until a later sample reads them, so a tree
of thousands is refined over some scans and never costs more than that budget a scan. Rejected: PSS for everything at every scan (the
cost above); RSS alone (twenty forked workers over-counted by their shared pages); /proc/<pid>/
status (four times statm's cost for the same counters).

A process that vanished between the scan and its read is left out of the sum (not an error): its
memory is freed. Zombies have none. Figures are bytes. Holds only open /proc files (bound to the
process, as guardd.scan explains), closed when their process is not seen again or at close().
Standard library only.
"""

from __future__ import annotations

import os
import time

from . import procs

PAGE = os.sysconf("SC_PAGE_SIZE")
PSS_BUDGET = 0.005  # CPU seconds of smaps_rollup reads a sample may spend
LARGE = 256 << 20  # bytes of RSS past which a process counts its RSS (no smaps_rollup read)
DRIFT = 0.5  # PSS is read again when RSS moved by this share of what it was at the last read


def _pread(fd: int) -> bytes | None:
    try:
        return os.pread(fd, 256, 0)
    except OSError:
        return None


def statm_of(data: bytes | None) -> tuple[int, int] | None:
    """(resident, resident and shared: file-backed or shmem) bytes from statm's text, None when
    there is none."""
    if not data:
        return None
    parts = data.split(None, 3)
    try:
        return int(parts[1]) * PAGE, int(parts[2]) * PAGE
    except (IndexError, ValueError):
        return None


def pss_of(pid: int) -> int | None:
    """The process's PSS in bytes from smaps_rollup, None when it cannot be read (gone, a
    kernel thread, not ours)."""
    data = procs.read_small(f"/proc/{pid}/smaps_rollup", 4096)
    if not data:
        return None
    at = data.find(b"\nPss:")
    if at < 0:
        return None
    try:
        return int(data[at + 5 :].split(None, 1)[0]) * 1024
    except (IndexError, ValueError):
        return None


class TreeMemory:
    """Samples of a tree's memory (see the design note): `now` and `peak`, bytes."""

    def __init__(self, max_held: int | None = None, clock=time.thread_time):
        if max_held is None:
            max_held = max(0, min(4096, (os.sysconf("SC_OPEN_MAX") - 64) // 8))
        self.max_held = max_held
        self.clock = clock
        self.now = 0
        self.peak = 0
        self.samples = 0
        # pid -> [start ticks, statm fd or -1, RSS at the last PSS read or -1, that PSS]
        self._known: dict[int, list[int]] = {}

    def sample(self, found) -> int:
        """One sample over a scan's processes (guardd.procs.Stat by pid); returns the sum."""
        total = 0
        spent = 0.0  # CPU seconds of smaps_rollup reads in this sample
        known = self._known
        for pid, proc in found.items():
            if proc.zombie:
                continue
            entry = known.get(pid)
            if entry is not None and entry[0] != proc.start:
                self._drop(pid)  # a new process under a reused pid
                entry = None
            if entry is None:
                fd = -1
                if len(known) < self.max_held:
                    try:
                        fd = os.open(f"/proc/{pid}/statm", os.O_RDONLY | os.O_CLOEXEC)
                    except OSError:
                        continue  # gone since the scan
                entry = known[pid] = [proc.start, fd, -1, 0]
            statm = statm_of(
                _pread(entry[1]) if entry[1] >= 0 else procs.read_small(f"/proc/{pid}/statm")
            )
            if statm is None:
                self._drop(pid)
                continue  # vanished: its memory is freed
            rss, shared = statm
            at = entry[2]
            stale = at < 0 or abs(rss - at) > at * DRIFT
            if stale and 0 < rss < LARGE and spent < PSS_BUDGET:
                began = self.clock()
                pss = pss_of(pid)  # None: it cannot be read (exiting): its RSS until it moves
                spent += self.clock() - began
                entry[2], entry[3] = rss, rss if pss is None else pss
                at = rss
            if rss >= LARGE:
                total += rss
            elif at < 0:
                total += rss - shared  # its own pages until its PSS is read (shared ones, ~0)
            else:
                total += max(0, entry[3] + rss - at)
        for pid in [p for p in known if p not in found]:
            self._drop(pid)
        self.now = total
        self.peak = max(self.peak, total)
        self.samples += 1
        return total

    def _drop(self, pid: int) -> None:
        entry = self._known.pop(pid, None)
        if entry is not None and entry[1] >= 0:
            os.close(entry[1])

    def held(self) -> int:
        """How many statm files are held open (for tests)."""
        return sum(1 for e in self._known.values() if e[1] >= 0)

    def close(self) -> None:
        for pid in list(self._known):
            self._drop(pid)
