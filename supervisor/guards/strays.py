"""The supervisor as the last child subreaper: what a lost guard leaves that no zygote ends.

Design note. The guard zygote ends what a dead guard's subtree leaves (guardd.strays), but two
kinds of guard have no zygote above them: a guard started directly (no zygote running: before the
first is ready, or after one is lost until the next is up), whose strays went to init; and a
zygote's guard once that zygote is dead too (a turn that SIGKILLs its guard and the zygote), whose
strays, held by the zygote, went to init with the zygote's other children. So the supervisor is a
child subreaper too (`start`): both come to it. The same guardd.strays.Strays counts them, here
against the guards whose strays come to the supervisor, `watch_guard`: each guard started directly,
and each guard of a lost zygote. When such a guard's exit is seen (`guard_exited`), its exit is held
back until none of its strays lives (SIGTERM and SIGCONT, SIGKILL after the guard's grace), as
the zygote holds its report: the slot is released only after the exit is handed on (the ending
table, supervisor.turns, releases only then), so the next turn never runs beside a stray.

Which children are ours. The supervisor's own children must never be taken for strays, nor their
statuses taken from their subprocess.Popen: a child in the supervisor's session is ours (no
guard's descendant can join it: every guard starts a session of its own), and the children it
starts in a session of their own say so (`own`: the zygote, the page; and each guard forked by a
zygote while it runs, which a dead zygote leaves to us). Anything else below us is a stray. What
comes to us is reaped here when it dies (on SIGCHLD, by its pid alone: a zombie that is our child
cannot be reused by another process until we reap it); an orphan in our own session is left (none
of our children leaves one). Rejected: a subreaper shim per direct guard (one more interpreter per
direct start, ~25 ms of CPU, and a turn can SIGKILL its shim as it does its guard), and waitid(P_ALL,
WNOWAIT) peeks (the first zombie it names may be a Popen's, hiding the others until it is polled).

State: none on disk; it lives in the supervisor. At its end (`close`, every turn gone by then) what
is left is SIGKILLed: nobody would count it. A supervisor that dies leaves them to init (its guards
wait to be adopted).
Knows processes and the event loop; nothing of turns or slots.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Callable

from guardd import linux, procs, scan
from guardd.strays import Strays

log = logging.getLogger("ccsup.strays")


class StrayWatch:
    """The supervisor's strays: `start(loop)` makes it the subreaper; `own`/`disown` name the
    children it started in sessions of their own; `watch_guard` names a guard whose strays come
    to us, and `guard_exited` hands its exit on once they are gone; `close` ends what is left."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.pid = os.getpid()
        self.session = os.getsid(0)
        self._own: set[int] = set()
        self._guards: dict[int, float] = {}  # guard pid -> its grace, until its exit is seen
        self._held: dict[int, Callable[[], None]] = {}  # guard pid -> its exit, held back
        self.strays = Strays(
            self.pid, lambda: self._guards, self._ours, clock, session=self.session
        )
        # Called before our children are judged (the launcher's: a zygote that died is settled
        # first, so that its live guards, reparented to us, are named to us, not taken for strays).
        self.settle: Callable[[], None] = lambda: None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Become a child subreaper, and reap what comes to us on SIGCHLD (a flag that cannot be
        set is logged: then nothing is held, and strays go to init as before)."""
        try:
            linux.register_subreaper()
        except OSError as e:
            log.error("%s: a lost guard's strays that no zygote ends go to init", e)
            return
        self._loop = loop
        loop.add_signal_handler(signal.SIGCHLD, self._reap_strays)

    def own(self, pid: int) -> None:
        """A child we started in a session of its own (or a zygote's guard): never a stray."""
        self._own.add(pid)

    def disown(self, pid: int) -> None:
        self._own.discard(pid)

    def watch_guard(self, pid: int, grace: float) -> None:
        """A guard whose strays come to us (started directly, or its zygote is gone)."""
        self._own.discard(pid)
        self._guards[pid] = grace

    def guard_exited(self, pid: int, on_exit: Callable[[], None]) -> None:
        """The guard has exited (reaped, if it was our Popen): on_exit is called now when it left
        no stray, else once they are gone."""
        grace = self._guards.pop(pid, None)
        if grace is None or self._loop is None:
            on_exit()
            return
        self._reap_strays()  # a lost zygote's guard is ours to reap now
        self._held[pid] = on_exit
        self._hand_on(self.strays.guard_ended(pid, 0, grace))
        if pid in self._held:
            log.warning(
                "guard %d left strays below the supervisor: ending them before its exit is handed on",
                pid,
            )

    def close(self) -> None:
        """At the supervisor's end: SIGKILL every stray left (nothing would count them)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._loop is not None:
            self.strays.end_all()
            self._loop.remove_signal_handler(signal.SIGCHLD)
            self._loop = None

    def _ours(self) -> set[int]:
        self.settle()
        return self._own

    def _look(self) -> None:
        self._timer = None
        self._reap_strays()
        self._hand_on(self.strays.look())

    def _hand_on(self, exits: list[tuple[int, int]]) -> None:
        wait = self.strays.timeout()
        if wait is not None and self._timer is None and self._loop is not None:
            self._timer = self._loop.call_later(wait, self._look)
        for pid, _ in exits:
            on_exit = self._held.pop(pid, None)
            if on_exit is None:
                continue
            try:
                on_exit()
            except Exception:  # noqa: BLE001 -- one guard's failure must not hold another's exit
                log.exception("unable to hand on the exit of guard %d", pid)

    def _reap_strays(self) -> None:
        """Reap each child of ours that died and is neither our Popen's nor a watched guard's
        still to be handed on (a zombie that is our child keeps its pid until we reap it)."""
        keep = self._own | self._guards.keys()
        for child in scan.children_of(self.pid):
            if child in keep:
                continue
            stat = procs.read_stat(child)
            if stat is None or not stat.zombie or stat.sid == self.session:
                continue
            try:
                os.waitpid(child, os.WNOHANG)
            except ChildProcessError:
                pass  # reaped meanwhile (a guard of a lost zygote, by its handle)
