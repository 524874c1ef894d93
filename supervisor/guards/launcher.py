"""Which way a guard starts: through the guard zygote, pipelined, else directly.

Design note. Through the zygote a guard costs the supervisor ~0.3 ms of its own work, but the
zygote's answer (it forks, waits for the child's set-up, opens a pidfd) takes 1-3 ms, more on a
loaded machine: waiting for it was ~27 % of the supervisor's wall time at 300 turns. So the
launcher does not wait. `start_guard` sends the spawn request (non-blocking; what the socket does
not take now is sent when it is writable) and returns a `PendingGuard`; the zygote answers one
request after another, in order, and each answer is taken on the event loop when it arrives and
settles the oldest pending request: a `spawn.ForkedGuardProcess`, or the OSError that kept its
child from being set up (a bad cwd). The caller (supervisor.turns.starting) goes on with the turn from
there. Rejected: a thread that waits for the answers (a second reader of the socket, and the
answers must still come back to the loop); a blocking spawn per turn (the old way).

The guarantees do not move:
- a grant is saved before its request is sent (the manager starts guards after the save);
- the zygote sends "go" to a child only after its answer is written, so a guard runs only once
  the answer is on its way to us, and a child whose answer never reaches us runs nothing;
- a zygote that dies with requests in flight (its socket's EOF): the answers it sent before are
  taken, and every request it did not answer is asked again, in order (see below);
- a zygote that stops answering (stopped, starved) while requests wait: when nothing has come
  for `answer_timeout` seconds (5 s; the time since the last answer, so a long but moving queue is
  not stuck), it is SIGKILLed and handled as dead. The watch is a timer on the loop, armed while
  requests wait.
A guard it forked keeps running under the supervisor's watch; its status is then unknown
(spawn.ForkedGuardProcess).

The daemon's first zygote is waited for until it is ready (~0.1 s), so a daemon serves warm. A
zygote that is lost, or cannot be started, is started again after 1 s, then twice as long after
each zygote in a row that never became ready, up to 60 s (a broken install is not started in a
tight loop); one that was ready resets the wait. Meanwhile guards start directly. A restarted
zygote is not waited for (`Zygote.launch`): requests queue on its socket and are answered once
it is ready, and one that dies first is lost like any other. Without the restart, one lost
zygote made every later turn of a long-lived supervisor pay a fresh interpreter (~25-36 ms of
CPU, and ~4.6 MiB of a guard's own memory against ~1.85).

The requests a lost zygote did not answer are asked again, one a loop turn. When it had answered
any, a new zygote is started at once and they go to it; else (it answered nothing: stuck from the
start, never ready, or killed by the first of them) they are started directly, and a zygote is
tried later as above. Each relaunch at once needs an answer since the last, so a request that
kills every zygote it reaches ends up started directly, not in a loop. Starting all of them
directly in one go on the loop would leave `status` unanswered for seconds (450 interpreters, a
zygote SIGKILLed after 50 of 500 turns: 8.6 s measured).

The supervisor is a child subreaper (supervisor.guards.strays, when the daemon gives one): the
launcher names to it each child started in a session of its own (every zygote, and each guard a
zygote forked, which its death leaves to us) and each guard whose strays come to it: one started
directly, and each guard of a lost zygote, whose exits then go through it.

Knows the zygote handle, guard processes and the event loop; nothing of turns or slots.
State: none stored; a restarted supervisor starts a zygote of its own, and so does the launcher
after a loss: the lost zygote's guards run on with statuses unknown (their records tell).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import deque
from collections.abc import Callable

from guardd.zygote_handle import Failed, Spawned, Zygote, ZygoteGone

from .handle import (
    ForkedGuardProcess,
    GuardProcess,
    GuardSpec,
    TruncatedCallback,
    _Pipes,
    close_all,
    guard_args,
    guard_env,
    open_stdio,
    start_guard,
)
from .strays import StrayWatch

log = logging.getLogger("ccsup.launcher")

ANSWER_TIMEOUT = 5.0  # seconds without an answer while requests wait: the zygote is stuck
RESTART_AFTER = 1.0  # seconds from a zygote's loss to the next one's start, doubled while they fail
RESTART_MAX = 60.0

Started = GuardProcess | OSError


class PendingGuard:
    """A guard asked of the zygote and not answered yet.

    `then(callback)` calls back once with the GuardProcess, or with the OSError that kept it from
    starting, always from the event loop (never inside the caller of `start_guard`)."""

    __slots__ = ("turn_id", "_result", "_callback")

    def __init__(self, turn_id: str):
        self.turn_id = turn_id
        self._result: Started | None = None
        self._callback: Callable[[Started], None] | None = None

    def then(self, callback: Callable[[Started], None]) -> None:
        if self._result is not None:
            callback(self._result)
        else:
            self._callback = callback

    def settle(self, result: Started) -> None:
        assert self._result is None, f"the guard of turn {self.turn_id} was settled twice"
        self._result = result
        callback, self._callback = self._callback, None
        if callback is not None:
            callback(result)


def _stopping() -> OSError:
    return OSError("unable to start the guard: the supervisor is stopping")


class _Request:
    """A request sent (or queued) to the zygote: what to settle, our pipe ends, and the guard's
    spec (to start it directly, or to ask for the same guard again: `Launcher._ask_again`)."""

    __slots__ = ("pending", "ours", "ready", "spec")

    def __init__(
        self, pending: PendingGuard, ours: tuple[int, int, int], ready: int, spec: GuardSpec
    ):
        self.pending, self.ours, self.ready, self.spec = pending, ours, ready, spec

    def close_ours(self) -> None:
        close_all((*self.ours, self.ready))


class Launcher:
    """Starts guards through a guard zygote while one runs, else directly (`handle.start_guard`).

    `start()` (on the running event loop) starts the zygote; `start_guard` takes a GuardSpec, as
    handle.start_guard does, and returns a GuardProcess (started directly) or a PendingGuard (asked of
    the zygote); `close()` stops the zygote. A zygote that cannot be started, dies, or stops
    answering is logged, and another is started later (see the module's docstring).
    """

    def __init__(
        self,
        python: str | None = None,
        *,
        launch_zygote=Zygote.launch,
        answer_timeout: float = ANSWER_TIMEOUT,
        restart_after: float = RESTART_AFTER,
        strays: StrayWatch | None = None,
    ):
        self.python = python
        # The supervisor as subreaper (the daemon's): told of every child we start in a session of
        # its own, and of each guard whose strays come to it (see supervisor.guards.strays).
        self.strays = strays
        if strays is not None:
            strays.settle = self._settle_zygote
        self.log_limit: int | None = None  # given to every guard started ([logs] turn_max_bytes)
        self.on_truncated: TruncatedCallback | None = None
        self.zygote: Zygote | None = None
        self.answer_timeout = answer_timeout
        self._launch_zygote = launch_zygote
        self.restart_after = restart_after
        self._restart_wait = restart_after  # the next restart's wait (doubled while they fail)
        self._restart: asyncio.TimerHandle | None = None
        self._closed = False
        self._forked: dict[int, ForkedGuardProcess] = {}
        self._waiting: deque[_Request] = deque()  # sent or queued, not answered: in order
        self._unanswered: deque[_Request] = deque()  # of a lost zygote: asked again, in order
        self._progress = 0.0  # monotonic time of the last answer (or of the first request)
        self._watchdog: asyncio.TimerHandle | None = None
        self._writing = False
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop `start()` was called on (a bug to ask before)."""
        assert self._loop is not None, "the launcher is not started"
        return self._loop

    @property
    def waiting(self) -> int:
        """Requests the zygote has not answered yet."""
        return len(self._waiting)

    def start(self) -> None:
        """Start the first zygote and wait until it is ready (~0.1 s: a daemon serves warm)."""
        self._loop = asyncio.get_running_loop()
        self._launch()
        if self.zygote is not None:
            try:
                self.zygote.wait_ready()
            except ZygoteGone as e:
                self._lost(str(e))

    def _launch(self) -> None:
        """Start a zygote (not waited for: requests queue until it is ready), or plan the next
        try."""
        self._restart = None
        try:
            zygote = self._launch_zygote(self.python)
        except OSError as e:
            wait = self._restart_later()
            log.warning(
                "unable to start the guard zygote: %s; guards are started directly, "
                "another try in %g s",
                e,
                wait,
            )
            return
        self.zygote = zygote
        if self.strays is not None:
            self.strays.own(zygote.pid)
        self.loop.add_reader(zygote.fileno(), self._on_readable)
        log.info("guard zygote started (pid %d)", zygote.pid)

    def _restart_later(self) -> float:
        """Plan the next zygote's start; its wait in seconds."""
        wait = self._restart_wait
        self._restart_wait = min(wait * 2, RESTART_MAX)
        if not self._closed:
            self._restart = self.loop.call_later(wait, self._launch)
        return wait

    def start_guard(self, spec: GuardSpec) -> GuardProcess | PendingGuard:
        """A GuardProcess started directly (OSError when it cannot be), or a PendingGuard."""
        if spec.log_dir is not None and spec.log_limit != self.log_limit:
            spec = dataclasses.replace(spec, log_limit=self.log_limit)  # the guard keeps it
        if self.zygote is None:
            return self._start_directly(spec)
        theirs, ours, ready = open_stdio(spec.stdin, spec.winsize, spec.guard_logs)
        try:
            self.zygote.request(
                guard_args(spec), cwd=spec.cwd, env=guard_env(spec.env), stdio=theirs
            )
        except (ZygoteGone, ValueError) as e:
            close_all((*theirs, *ours, ready))
            if isinstance(e, ZygoteGone):
                self._lost(str(e))
            else:
                log.info("turn %s: %s; its guard is started directly", spec.turn_id, e)
            return self._start_directly(spec)
        if not self._waiting:
            self._progress = time.monotonic()
        request = _Request(PendingGuard(spec.turn_id), ours, ready, spec)
        self._waiting.append(request)
        self._flush()
        self._watch()
        return request.pending

    def _start_directly(self, spec: GuardSpec) -> GuardProcess:
        guard = self._configured(start_guard(spec))
        if self.strays is not None:  # no zygote above it: its strays come to the supervisor
            self.strays.watch_guard(guard.pid, spec.grace)
            guard.exit_gate = self.strays.guard_exited
        return guard

    def _configured(self, guard: GuardProcess) -> GuardProcess:
        guard.log_limit = self.log_limit
        guard.on_truncated = self.on_truncated
        return guard

    def close(self) -> None:
        """Stop the zygote (at the daemon's end: every turn is gone by then)."""
        self._closed = True
        if self._restart is not None:
            self._restart.cancel()
            self._restart = None
        while self._unanswered:  # a lost zygote's, still to be asked again
            self.loop.call_soon(self._unanswered.popleft().pending.settle, _stopping())
        zygote, self.zygote = self.zygote, None
        if zygote is None:
            return
        self.loop.remove_reader(zygote.fileno())
        self._stop_writing(zygote)
        zygote.close()
        self._disown(zygote)
        for request in self._drain_waiting():
            request.close_ours()
            self.loop.call_soon(request.pending.settle, _stopping())
        self._orphan_all()

    # -- the event loop's side -------------------------------------------------------------------

    def _flush(self) -> None:
        zygote = self.zygote
        if zygote is None:
            return
        try:
            done = zygote.flush()
        except ZygoteGone as e:
            self._lost(str(e))
            return
        if not done and not self._writing:
            self.loop.add_writer(zygote.fileno(), self._flush)
            self._writing = True
        elif done:
            self._stop_writing(zygote)

    def _stop_writing(self, zygote: Zygote) -> None:
        if self._writing:
            self._writing = False
            if zygote.fileno() >= 0:
                self.loop.remove_writer(zygote.fileno())

    def _on_readable(self) -> None:
        zygote = self.zygote
        if zygote is None:
            return
        try:
            self._take(zygote.answers())
        except OSError as e:
            zygote.kill()
            self._lost(str(e))
            return
        self._deliver(zygote)
        if not zygote.alive:
            self._lost(f"it exited with status {zygote.proc.returncode}")

    def _take(self, answers: list[Spawned | Failed]) -> None:
        """Settle the oldest waiting requests with these answers, in order."""
        for answer in answers:
            if not self._waiting:
                raise OSError("unable to read the zygote's answers: one more than was asked")
            request = self._waiting.popleft()
            self._progress = time.monotonic()
            result: Started
            if isinstance(answer, Spawned):
                guard = ForkedGuardProcess(
                    request.pending.turn_id,
                    _Pipes(answer.pid, *request.ours),
                    request.spec.record_dir,
                    pidfd=answer.pidfd,
                    start=answer.start,
                    ready=request.ready,
                )
                guard.stdin_held = request.spec.holds_stdin
                self._forked[answer.pid] = guard
                guard.grace = request.spec.grace
                if self.strays is not None:  # its zygote's child; ours if the zygote dies
                    self.strays.own(answer.pid)
                result = self._configured(guard)
            else:
                request.close_ours()
                result = answer.error(request.spec.cwd)
            self.loop.call_soon(request.pending.settle, result)

    def _deliver(self, zygote: Zygote) -> None:
        """Hand each status reported to its guard, from the loop (never inside a caller): those
        `answers()` read. (Reading here too could read an answer that then waits, unread, until the
        zygote's next message: the last of a burst waited for the watchdog, 5 s, and the zygote
        was killed.)"""
        for pid, returncode in zygote.poll_reports(read=False):
            guard = self._forked.pop(pid, None)
            if guard is not None:
                if self.strays is not None:
                    self.strays.disown(pid)
                self.loop.call_soon(guard.status_reported, returncode)

    def _watch(self) -> None:
        """While requests wait, a timer checks that answers keep coming."""
        if self._watchdog is None and self._waiting and self.zygote is not None:
            self._watchdog = self.loop.call_later(self.answer_timeout, self._check_stuck)

    def _check_stuck(self) -> None:
        self._watchdog = None
        zygote = self.zygote
        if zygote is None or not self._waiting:
            return
        quiet = time.monotonic() - self._progress
        if quiet < self.answer_timeout:
            self._watchdog = self.loop.call_later(self.answer_timeout - quiet, self._check_stuck)
            return
        zygote.kill()
        self._lost(
            f"it answered nothing for {quiet:.1f} s with {len(self._waiting)} waiting; killed"
        )

    def _lost(self, why: str) -> None:
        """The zygote is gone (or was given up): take what it said, ask for the rest again."""
        zygote, self.zygote = self.zygote, None
        if zygote is None:
            return
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        self._stop_writing(zygote)
        self.loop.remove_reader(zygote.fileno())
        try:
            self._take(zygote.answers())  # what it answered before it went
        except OSError as e:
            log.warning("the guard zygote's last answers are unusable: %s", e)
        self._deliver(zygote)
        zygote.close()  # reaped: what it left is reparented to us by now (supervisor.guards.strays)
        self._disown(zygote)
        if zygote.ready:  # it had started well: the next one is tried soon
            self._restart_wait = self.restart_after
        unanswered = self._drain_waiting()  # their children never run: each is asked again
        for request in unanswered:
            request.close_ours()
        if unanswered and zygote.answered:
            log.warning(
                "the guard zygote (pid %d) is gone (%s) with %d requests unanswered: they go to "
                "a new one",
                zygote.pid,
                why,
                len(unanswered),
            )
            self._launch()  # at once: it worked, and a fork each beats an interpreter each
        else:
            wait = self._restart_later()
            log.warning(
                "the guard zygote (pid %d) is gone (%s): guards are started directly until the "
                "next one, in %g s",
                zygote.pid,
                why,
                wait,
            )
        self._orphan_all()
        if unanswered and not self._unanswered:
            self.loop.call_soon(self._ask_again)
        # First: older than any still to be asked again (a zygote lost while they are asked).
        self._unanswered.extendleft(reversed(unanswered))

    def _ask_again(self) -> None:
        """One unanswered request of a lost zygote asked again, one a loop turn: of the zygote
        running now, else started directly (3-20 ms each: hundreds in one go blocked the loop
        for seconds)."""
        if not self._unanswered:
            return  # settled by close() meanwhile
        request = self._unanswered.popleft()
        if self._unanswered:
            self.loop.call_soon(self._ask_again)
        started: GuardProcess | PendingGuard | OSError
        try:
            started = self.start_guard(request.spec)
        except OSError as e:
            started = e
        if isinstance(started, PendingGuard):
            started.then(request.pending.settle)
        else:
            request.pending.settle(started)

    def _drain_waiting(self) -> list[_Request]:
        waiting = list(self._waiting)
        self._waiting.clear()
        return waiting

    def _settle_zygote(self) -> None:
        """Before the supervisor's strays are judged: a zygote that died is taken as lost now,
        its answers read, so that its guards are named (they are reparented to us with it)."""
        zygote = self.zygote
        if zygote is not None and zygote.proc.poll() is not None:
            self._on_readable()

    def _disown(self, zygote: Zygote) -> None:
        if self.strays is not None:
            self.strays.disown(zygote.pid)

    def _orphan_all(self) -> None:
        """The lost zygote's guards: no status will come, and their strays come to us."""
        forked, self._forked = self._forked, {}
        for guard in forked.values():
            if self.strays is not None:
                self.strays.watch_guard(guard.pid, guard.grace)
                guard.exit_gate = self.strays.guard_exited
            self.loop.call_soon(guard.status_reported, None)
