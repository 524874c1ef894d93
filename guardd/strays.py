"""A lost guard's strays: what its subtree left behind, ended by the zygote before the guard's exit
is reported.

Design note. A guard ends its turn's work and exits only when nothing of it is left; a guard that
is killed outright (by its own turn, `kill -9 $PPID`, or from outside) cannot. Its record names the
groups it saw, and the supervisor ends those and every process still marked with the turn's
environment; but a descendant that left the turn's group and session and dropped its marker (`setsid
env -i ...`) before the guard's next scan is in neither, and it ran on beside the next turn of the
slot the supervisor released. The zygote closes that gap: it is a child subreaper, so whatever a
dead guard's subtree leaves (the guard's children, and later their orphans) is reparented to it,
not to init; its own children are only its guards and its spares, so any other process below it
belongs to a guard that died. When a guard it forked is reaped and such processes exist, the
guard's exit is held back: every stray gets SIGTERM (then SIGCONT, so a stopped one sees it), after
the guard's grace SIGKILL, and the exit is reported only once none of its strays lives. The
supervisor releases a slot only after that report (supervisor.guards.handle waits for it), so the
next turn never runs beside a stray.

Which guard a stray belongs to. Reparenting says nothing of where a process came from, so a stray
is attributed when first seen: to the guards found dead since the last look (usually one: the
guard whose death just reparented it; with several killed at once, each dead one not yet reaped
counts too, so a stray is never counted against another guard alone), else to its parent's guards when its parent is a known stray
(forked since), else to every guard still waiting. A doubtful stray thus holds every guard it may
belong to; none is ever released early. Strays are looked for at each lost guard's reap and every
LOOK seconds while one waits (an orphan reparented when a deeper stray dies brings no SIGCHLD).

Rejected: attributing by the environment marker or the session (the escapee drops both), and a
walk of all of /proc (the zygote's own subtree is the whole question, read from its children).

The supervisor runs the same class (supervisor.guards.strays): it is a child subreaper too, for
the guards it started directly (no zygote above them) and for a dead zygote's guards and strays (a
turn that SIGKILLs its guard and the zygote); there the guards are those whose strays come to it,
and its own children (a session of their own that it named, or its own session) are never strays.

What remains possible (no cgroup): a stray that the zygote cannot signal (a setuid program run
by the turn) holds its guard's report, and so its slot, until it ends; the supervisor's own death
leaves what is below it to init.

State: none on disk; it lives in the zygote. A zygote that exits with guards waiting SIGKILLs
their strays first (`end_all`): nobody would report them.
Standard library only.
"""

from __future__ import annotations

import signal
import time

from . import procs, scan
from .procs import Identity

LOOK = 0.05  # seconds between looks for strays while a lost guard waits


class _Lost:
    __slots__ = ("code", "kill_at", "strays")

    def __init__(self, kill_at: float):
        self.code: int | None = None  # None: dead but not reaped yet (its exit still to come)
        self.kill_at = kill_at
        self.strays: set[Identity] = set()


class Strays:
    """The strays of a subreaper's lost guards, and the exits held back until they are gone.

    subreaper: this process (the zygote, or the supervisor: supervisor.guards.strays); guards: a
    callable giving its guards whose strays come to it and whose exit is not handled yet, pid ->
    grace; others: one giving the pids of its other children that are never strays (the zygote's
    spares; the supervisor's own children). session: when given, a child in that session (the
    subreaper's own) is never a stray either: no guard's descendant can join it (every guard starts
    a session of its own)."""

    def __init__(self, subreaper: int, guards, others, clock=time.monotonic, *, session=None):
        self.subreaper = subreaper
        self.guards = guards
        self.others = others
        self.session: int | None = session
        self.clock = clock
        self.waiting: dict[int, _Lost] = {}  # guard pid -> its held exit
        self._owners: dict[Identity, set[int]] = {}
        self._fresh_guards: set[int] = set()  # guards found dead since the last look
        self._next_look = 0.0

    def guard_ended(self, pid: int, code: int, grace: float) -> list[tuple[int, int]]:
        """A guard was reaped: the exits to report now, [(pid, code)], its own unless it left
        strays (then held until they are gone)."""
        if not self.waiting and not self._unknown_children():
            return [(pid, code)]  # the common end: one read of our children, none unknown
        lost = self.waiting.get(pid)
        if lost is None:
            lost = self.waiting[pid] = _Lost(self.clock() + grace)
            self._fresh(pid)
        lost.code = code
        return self.look()

    def _fresh(self, pid: int) -> None:
        """A guard just found dead: what has no owner yet may be its."""
        self._fresh_guards.add(pid)

    def timeout(self) -> float | None:
        """Seconds until the next look is due (0: now); None when no guard waits."""
        return max(0.0, self._next_look - self.clock()) if self.waiting else None

    def look(self) -> list[tuple[int, int]]:
        """Find, attribute and signal the strays; the held exits whose strays are all gone."""
        if not self.waiting:
            return []
        now = self.clock()
        self._next_look = now + LOOK
        tree = self._stray_tree()
        if any(ident not in self._owners for ident in tree):
            # Guards dead but not reaped yet (several can die at once): their orphans may be
            # here already, so they are candidates for what is new, not only the one reaped.
            for pid, grace in self.guards().items():
                stat = procs.read_stat(pid)
                if pid not in self.waiting and (stat is None or stat.zombie):
                    self.waiting[pid] = _Lost(now + grace)
                    self._fresh(pid)
        for ident, parent in tree.items():
            if ident in self._owners:
                continue
            owners = set(self._fresh_guards)
            if not owners and parent is not None:
                owners = self._owners.get(parent, set())
            owners = owners or set(self.waiting)
            self._owners[ident] = owners
            for guard in owners:
                self.waiting[guard].strays.add(ident)
            procs.signal_process(ident, signal.SIGTERM)
            procs.signal_process(ident, signal.SIGCONT)
        self._fresh_guards.clear()
        self._owners = {i: o for i, o in self._owners.items() if i in tree}
        ready: list[tuple[int, int]] = []
        for guard, lost in list(self.waiting.items()):
            lost.strays &= tree.keys()
            if not lost.strays and lost.code is not None:
                del self.waiting[guard]
                ready.append((guard, lost.code))
            elif lost.strays and now >= lost.kill_at:
                for ident in lost.strays:
                    procs.signal_process(ident, signal.SIGKILL)
        return ready

    def end_all(self) -> None:
        """SIGKILL every stray now (the zygote is exiting: nothing would report them)."""
        for ident in self._stray_tree():
            procs.signal_process(ident, signal.SIGKILL)

    def _unknown_children(self) -> list[int]:
        children = scan.children_of(self.subreaper)
        # Asked after the read: others() may learn of children that came to us meanwhile (the
        # supervisor settles a zygote that died: its live guards are reparented to it).
        known = {*self.others(), *self.guards()}
        children = [c for c in children if c not in known]
        if self.session is None or not children:
            return children
        return [
            c for c in children if (s := procs.read_stat(c)) is not None and s.sid != self.session
        ]

    def _stray_tree(self) -> dict[Identity, Identity | None]:
        """Every live process below our unknown children (them included) -> its parent's
        identity when the parent is one of them too."""
        found: dict[int, procs.Stat] = {}
        for child in self._unknown_children():
            stat = procs.read_stat(child)
            if stat is None:
                continue
            found[child] = stat
            found.update(scan.descendants(child))
        tree: dict[Identity, Identity | None] = {}
        for stat in found.values():
            if stat.zombie:
                continue  # runs nothing; its parent (we, for a child) reaps it
            parent = found.get(stat.ppid)
            tree[Identity(stat.pid, stat.start)] = (
                Identity(parent.pid, parent.start) if parent is not None else None
            )
        return tree
