"""What a turn's whole tree used: CPU seconds, peak resident bytes, processes started.

Design note. Without a cgroup the guard knows usage from what it reaps: as a child subreaper it
reaps CMD and every orphaned descendant, and wait4's rusage of a reaped child includes the
children that child reaped in turn, so the sum over everything the guard reaps covers the whole
tree once it has ended; ru_maxrss is the largest single process (kernel: the max over the child
and its reaped descendants), hence `peak_rss_bytes` is the largest process's peak there. A process
still running when the figures are read is not in them yet ("so far"). With a cgroup, cpu.stat
counts every process that ever ran inside (exact, live), and memory.peak (where the memory
controller is enabled) is the peak of the whole cgroup.

Memory of the whole tree: `mem` (bytes now) and `peak_mem` (the largest `mem`, bytes) are the
cgroup's memory.current and memory.peak where it has the memory controller, else guardd.treemem's
samples, taken at the guard's scans (`sample`, at most once a scan interval), with the largest
single process's peak (`peak_rss_bytes`) as a floor: a turn that ended before its first sample
still has a figure.

`processes` is counted from what the guard sees: every distinct (pid, start) its scans found plus
every child it reaped that no scan had shown. A process that starts and ends between two scans
and is reaped by its own parent is not seen: the count is a lower bound (exact for trees whose
processes live across a scan or end as orphans).

Figures: `cpu_user_s`, `cpu_system_s` (float seconds), `peak_rss_bytes`, `mem`, `peak_mem` (int
bytes), `processes` (int).
State: in memory in the guard, written into its record (`usage`) at every record write and at
most once a second otherwise. Standard library only.
"""

from __future__ import annotations

import os

from guardd import cgroup as cgroups
from guardd.treemem import TreeMemory

WRITE_EVERY = 1.0  # seconds between record writes for usage alone


class Usage:
    __slots__ = (
        "cgroup",
        "user",
        "system",
        "peak",
        "identities",
        "last_start",
        "unseen",
        "_at",
        "tree",
        "_kernel_memory",
    )

    def __init__(self, cgroup: str | None = None):
        self.cgroup = cgroup
        self.user = 0.0
        self.system = 0.0
        self.peak = 0  # bytes
        self.identities: set[tuple[int, int]] = set()
        self.last_start: dict[int, int] = {}  # pid -> start ticks of the process last seen there
        self.unseen = 0  # reaped children no scan had shown
        self._at = 0.0
        self.tree: TreeMemory | None = None  # made at the first sample without memory.current
        self._kernel_memory: bool | None = None  # the cgroup has memory.current (looked once)

    def sample(self, found) -> None:
        """The tree's memory now, from a scan's descendants (guardd.scan.Proc by pid); nothing
        to do where the cgroup's memory controller counts it."""
        if self._kernel_memory is None:
            self._kernel_memory = self.cgroup is not None and os.path.exists(
                os.path.join(self.cgroup, "memory.current")
            )
        if self._kernel_memory:
            return
        if self.tree is None:
            self.tree = TreeMemory()
        self.tree.sample(found)

    def seen(self, found) -> None:
        """A scan's descendants (guardd.scan.Proc by pid)."""
        for proc in found.values():
            self.identities.add((proc.pid, proc.start))
            self.last_start[proc.pid] = proc.start

    def reaped(self, pid: int, rusage) -> None:
        self.user += rusage.ru_utime
        self.system += rusage.ru_stime
        self.peak = max(self.peak, rusage.ru_maxrss * 1024)  # Linux gives KiB
        if self.last_start.pop(pid, None) is None:
            self.unseen += 1

    def due(self, now: float) -> bool:
        """True at most once every WRITE_EVERY seconds: time to write the figures so far."""
        if now - self._at < WRITE_EVERY:
            return False
        self._at = now
        return True

    def to_json(self) -> dict:
        user, system, peak = self.user, self.system, self.peak
        if self.cgroup is not None:
            try:
                found = cgroups.usage(self.cgroup)
            except OSError:
                found = {}
            if "user_usec" in found:
                user = found["user_usec"] / 1e6
                system = found.get("system_usec", 0) / 1e6
        else:
            found = {}
        now = self.tree.now if self.tree is not None else 0
        peak_mem = max(self.tree.peak if self.tree is not None else 0, peak)
        if "memory_peak" in found:  # the kernel's own figures for the whole tree
            peak = peak_mem = found["memory_peak"]
            now = found.get("memory_current", now)
        return {
            "cpu_user_s": round(user, 6),
            "cpu_system_s": round(system, 6),
            "peak_rss_bytes": peak,
            "processes": len(self.identities) + self.unseen,
            "mem": now,
            "peak_mem": peak_mem,
        }
