"""Riding through a supervisor's restart: a follower of a turn notices its supervisor is gone,
waits for one to answer again, and catches up with what it missed.

Design note. A running turn outlives its supervisor for `[guard] adopt_within` (the guard keeps
the work and writes its logs itself), so a client that follows a turn must not give up when the
supervisor disappears: `ccsup run` and Client.run_turn use a `TurnRider`.
- Gone: the supervisor's pid (from `status`) is watched through a pidfd, which is readable once
  that process has ended: exact (no pid reuse) and one poll(2) when the bus is quiet. The lock
  file names the pid that holds it, so a pid that is not the lock's (another pid namespace) is
  not trusted: the lock itself is asked instead (supervisor.instance), as where there is no pidfd.
- Back: within `adopt_within` + RETURN_MARGIN (a supervisor that adopts at the guards' deadline
  still has to start and answer), the lock is held again and `status` answers; else SupervisorLost
  (`ccsup run` exits 71). The margin also lets a supervisor restarted at once (systemd's
  Restart=) tell the end of a turn whose guard did not wait (`adopt_within = "0s"`).
- Catching up: a fresh subscription (live before anything is asked), then `ps`. A turn held for
  its requester (granted before the crash, its guard never started: `held_until` on its wait,
  supervisor.turns.rerun) is asked for again, the same request by the same id (`ask_again`). A
  turn still there (a slot or a wait) tells the rest of its story on the bus; one that is not has ended, and
  its end is in the history file (supervisor.history.db, written by the supervisor as it
  publishes, so it is waited for a moment). Events of kinds not yet seen are taken from the
  history (a new supervisor's first events, `adopted` or `exited` at its start, go out before a
  client can have resubscribed). Output is not here: it is in the turn's logs at the same
  offsets, so a follower fills from them by offset (OutputFollower, TurnOutput's `fill`) and
  skips what is below what it already gave: no byte twice, none missing.
- No supervisor within that time: the files are asked (`on_file`) before the follower gives up.
  The history may hold its end; else the turn's guard record (`<state>/guards/*.json`, its
  `turn`) says how a command that ended by itself ended (`exited` and `released` are given from
  it, marked `"inferred": true`, with the guard's `exited_at`); a turn this follower saw queued
  and never granted, with no guard, still waits in queue.json (its requester, this process,
  alive): "queued", and the follower waits on for a supervisor. Only a turn neither ended nor
  queued has an end that is not known (SupervisorLost, 71).
Rejected: taking a silent bus for a dead supervisor (a stopped or busy one is silent too), and
pinging `status` to find out (a request every second per follower, and a stuck supervisor looks
dead).

Knows the client, its subscriptions, `status`/`ps` results and the history's reader; nothing of
terminals or exit codes beyond SupervisorLost's. State: in memory only (the watched run, the kinds
of event seen).
"""

from __future__ import annotations

import asyncio
import os
import select
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

from ..errors import CcsupError, NotRunning, SupervisorLost
from ..paths import ipc_path
from ..wire import protocol

T = TypeVar("T")

if TYPE_CHECKING:
    from ..paths import StatePaths
    from .subscription import Subscription


class Client(Protocol):
    """What riding through uses of a supervisor.client.control.Client (which imports this module
    for `run_turn`: a Protocol here, not an import back)."""

    timeout: float
    control_endpoint: str
    paths: StatePaths
    state_dir: Path

    def running(self) -> bool: ...
    def status(self) -> dict: ...
    def ps(self) -> dict: ...
    def drop_requests(self) -> None: ...
    def subscribe(self, prefixes: list[str]) -> Subscription: ...


RETURN_MARGIN = 5.0  # seconds past adopt_within a client still waits for a supervisor to answer
POLL = 0.05  # seconds between looks for a supervisor while none answers
IDLE = 0.1  # seconds of a quiet bus before the supervisor's pid is looked at
HISTORY_WAIT = 5.0  # seconds an ended turn's end is waited for in the history file


class Watch:
    """One supervisor run, as `status` described it: its pid (through a pidfd), epoch and
    adopt_within."""

    def __init__(self, client: Client, status: dict):
        self.client = client
        self.pid = status.get("pid")
        self.epoch = status.get("epoch")
        adopt_within = status.get("adopt_within")
        self.adopt_within = float(adopt_within) if isinstance(adopt_within, int | float) else 0.0
        self._pidfd: int | None = None
        self._gone_at_open = False
        if isinstance(self.pid, int) and self._pid_is_the_locks():
            try:
                self._pidfd = os.pidfd_open(self.pid)
            except ProcessLookupError:
                self._gone_at_open = True
            except OSError:
                pass  # no pidfd here: the lock is asked instead

    def _pid_is_the_locks(self) -> bool:
        """Only a local supervisor whose lock file names this pid is watched by its pid."""
        if ipc_path(self.client.control_endpoint) is None:
            return False
        try:
            return int(self.client.paths.lock.read_text().strip()) == self.pid
        except (OSError, ValueError):
            return False

    @property
    def wait_limit(self) -> float:
        """How long a follower waits for a supervisor to answer again once this one is gone."""
        return self.adopt_within + RETURN_MARGIN

    def fileno(self) -> int | None:
        """The pidfd, readable once this supervisor run has ended (None: ask `gone` instead)."""
        return None if self._gone_at_open else self._pidfd

    def gone(self) -> bool:
        """Whether this supervisor run has ended (cheap: one poll of its pidfd)."""
        if self._gone_at_open:
            return True
        if self._pidfd is not None:
            return bool(select.select([self._pidfd], [], [], 0)[0])
        return not self.client.running()

    def close(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


def await_return(
    client: Client, within: float, *, interrupted: Callable[[], bool] = lambda: False
) -> dict | None:
    """The `status` of a supervisor answering on the client's state directory within `within`
    seconds (the old one's requests dropped first); None when none did, or `interrupted()`."""
    deadline = time.monotonic() + within
    client.drop_requests()
    while not interrupted():
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        status = status_if_back(client, left)
        if status is not None:
            return status
        time.sleep(min(POLL, max(0.0, deadline - time.monotonic())))
    return None


async def await_return_async(
    client: Client,
    within: float,
    offload: Callable[[Callable[[], dict | None]], Awaitable[dict | None]],
) -> dict | None:
    """await_return for an event loop: the looks run through `offload` (a worker thread), and
    the pauses between them hold no thread."""
    deadline = time.monotonic() + within
    client.drop_requests()
    while (left := deadline - time.monotonic()) > 0:
        status = await offload(lambda: status_if_back(client, left))
        if status is not None:
            return status
        await asyncio.sleep(min(POLL, max(0.0, deadline - time.monotonic())))
    return None


def status_if_back(client: Client, within: float) -> dict | None:
    """One look: the `status` of a supervisor that holds the lock and answers within `within`
    seconds (at most the client's timeout); None while none does (starting, or gone again)."""
    if not client.running():
        return None
    saved_timeout = client.timeout
    client.timeout = max(0.05, min(saved_timeout, within))
    try:
        return client.status()
    except CcsupError:
        return None
    finally:
        client.timeout = saved_timeout


def _kind(topic: str) -> str:
    return topic.rsplit(".", 1)[-1]


def guard_record_of(guards: Path, turn_id: str) -> dict | None:
    """The record of the guard that ran `turn_id` in this records directory (read bounded, as
    every state file: guardd.record.read_json), or None; one that cannot be read is passed over."""
    from guardd.record import RecordError, read_json

    try:
        names = [n for n in os.listdir(guards) if n.endswith(".json")]
    except OSError:
        return None
    for name in names:
        try:
            record = read_json(guards / name)
        except (OSError, RecordError):
            continue
        if record.get("turn") == turn_id:
            return record
    return None


def recorded_end(record: dict) -> dict | None:
    """The `exited` body of a command that ended by itself, from its guard's record; None when
    the record does not say so (still running, or ended by its guard: not_adopted)."""
    exit_info = record.get("exit")
    if record.get("state") != "gone" or record.get("reason") != "exited":
        return None
    if not isinstance(exit_info, dict):
        return None
    code, signum = exit_info.get("code"), exit_info.get("signal")
    if isinstance(signum, int):
        code = 128 + signum
    elif not isinstance(code, int):
        return None
    end = {"id": record.get("turn"), "code": code, "signal": signum, "reason": None}
    if isinstance(record.get("exited_at"), int | float):
        end["exited_at"] = record["exited_at"]
    return {**end, "inferred": True}


class TurnRider:
    """Follows one turn across supervisor restarts: `gone` when the bus is quiet, then
    `come_back` (a live subscription and the events missed), and `before_end` for a terminal
    event that came after a restart."""

    def __init__(self, client: Client, turn_id: str, status: dict | None = None):
        self.client = client
        self.turn_id = turn_id
        self.watch = Watch(client, status if status is not None else client.status())
        self.seen: set[str] = set()  # the kinds of this turn's events seen (or taken from history)
        self.restarts = 0  # supervisors come back while following
        # Sends this turn's request again, as first sent (same id, argv, env, stdin): when the
        # supervisor that answers holds the turn for its requester (`ps`'s `held_until`: it was
        # granted before a crash and its guard never started), catch_up asks it again.
        self.ask_again: Callable[[], object] | None = None
        self.asked_again = 0

    def saw(self, topic: str) -> None:
        if topic.startswith(f"turn.{self.turn_id}."):
            self.seen.add(_kind(topic))

    def gone(self) -> bool:
        return self.watch.gone()

    def await_return(self, *, interrupted: Callable[[], bool] = lambda: False) -> dict | None:
        """Wait for a supervisor (SupervisorLost is the caller's to raise: it may print first)."""
        status = await_return(self.client, self.watch.wait_limit, interrupted=interrupted)
        if status is not None:
            self.watch.close()
            self.watch = Watch(self.client, status)
            self.restarts += 1
        return status

    def ask_through(
        self, *, interrupted: Callable[[], bool] = lambda: False
    ) -> tuple[object, Subscription | None]:
        """Send the turn's request (`ask_again`); when its supervisor dies before it answers,
        wait for one to answer again, subscribe there, and send it again by the same id (a
        request is idempotent by id: one the dead supervisor saved is answered, or taken if it
        holds the turn granted-not-started; one it never saved is queued once). Returns the
        answer and the new live subscription (None when the first supervisor answered: the
        caller's still serves); SupervisorLost when none came back in time. An error reply (a
        refusal) is raised as it is."""
        assert self.ask_again is not None
        sub: Subscription | None = None
        try:
            while True:
                try:
                    return self.ask_again(), sub
                except CcsupError as e:
                    unanswered = isinstance(e, NotRunning) or type(e) is CcsupError
                    if not unanswered or not self.watch.gone():
                        raise  # a reply (a refusal), or a supervisor that is still there
                if sub is not None:
                    sub.close()
                    sub = None
                while sub is None:
                    if self.await_return(interrupted=interrupted) is None:
                        raise self.lost()
                    sub = self.resubscribe()
        except BaseException:
            if sub is not None:
                sub.close()
            raise

    def lost(self) -> SupervisorLost:
        return SupervisorLost(
            f"the supervisor on {self.client.state_dir} is gone and none answered within "
            f"{self.watch.wait_limit:g} s (adopt_within {self.watch.adopt_within:g} s + "
            f"{RETURN_MARGIN:g} s): turn {self.turn_id}'s end is not known (its guard ends "
            "its work: reason not_adopted)"
        )

    def on_file(self) -> tuple[str, list[tuple[str, dict]]]:
        """With no supervisor answering: what the state directory's files say of the turn.
        ("ended", its missed events up to the terminal one): the history has its end, or its
        guard's record says its command ended by itself; ("queued", []): it waits in the queue
        (seen queued, never granted, no guard record); ("unknown", []): neither."""
        events = self._unseen(terminal=True)
        if events and _kind(events[-1][0]) in protocol.TERMINAL_EVENTS:
            return "ended", events
        record = guard_record_of(self.client.paths.guards, self.turn_id)
        if record is not None:
            end = recorded_end(record)
            if end is None:
                return "unknown", []
            exited = [] if "exited" in self.seen else [(f"turn.{self.turn_id}.exited", end)]
            released = (f"turn.{self.turn_id}.released", {"id": self.turn_id, "inferred": True})
            for topic, _ in [*exited, released]:
                self.seen.add(_kind(topic))
            return "ended", [*events, *exited, released]
        if "queued" in self.seen and not self.seen & {"granted", "started", "adopted"}:
            return "queued", []
        return "unknown", []

    def resubscribe(self) -> Subscription | None:
        """A live subscription to the turn's topics on the supervisor that answered; None when
        that one is gone again before it took the subscription (killed twice in a row): the
        caller then waits for the next (`await_return`)."""
        return self._asked_again(lambda: self.client.subscribe([f"turn.{self.turn_id}."]))

    def catch_up(self) -> list[tuple[str, dict]]:
        """After `resubscribe`: the events missed, in order, from the history (kinds not yet
        seen); they end with the terminal event when the turn is no longer there (`ps`). Nothing
        when the supervisor that answered is gone again before `ps` answered (killed twice in a
        row): the follower's loop sees it gone and rides through once more."""
        ps = self._ps()
        if ps is None:
            return []
        slots = [s for s in ps.get("slots", []) if s.get("turn") == self.turn_id]
        waits = [w for w in ps.get("waits", []) if w.get("id") == self.turn_id]
        present = bool(slots) or bool(waits)
        if any(w.get("held_until") for w in waits) and self.ask_again is not None:
            # held for us: the same request again, by its id (the supervisor takes it as the
            # held turn's); a supervisor gone again meanwhile holds it again for the next look
            if self._asked_again(self.ask_again) is not None:
                self.asked_again += 1
        deadline = time.monotonic() + HISTORY_WAIT
        events: list[tuple[str, dict]] = []
        if present:
            # An adopted turn's `adopted` is in the history soon (its writer batches): waited
            # for, so it comes before what the bus brings next.
            adopted = any(s.get("adopted_at") for s in slots) and "adopted" not in self.seen
            while True:
                events += self._unseen(terminal=False)
                if not adopted or "adopted" in self.seen or time.monotonic() >= deadline:
                    return events
                time.sleep(POLL)
        while True:
            events += self._unseen(terminal=True)
            if events and _kind(events[-1][0]) in protocol.TERMINAL_EVENTS:
                return events
            if time.monotonic() >= deadline:
                # Gone, and no history says how: an end without an exit status.
                inferred = {"id": self.turn_id, "inferred": True}
                return [*events, (f"turn.{self.turn_id}.released", inferred)]
            time.sleep(POLL)

    def _ps(self) -> dict | None:
        """`ps` of the supervisor that answered (None once it is gone: see _asked_again)."""
        return self._asked_again(self.client.ps)

    def _asked_again(self, ask: Callable[[], T]) -> T | None:
        """ask() of the supervisor that answered, again while it is busy (starting, adopting) up
        to wait_limit; None once it is gone (the caller rides through once more)."""
        deadline = time.monotonic() + self.watch.wait_limit
        while True:
            try:
                return ask()
            except CcsupError:
                if self.watch.gone():
                    return None
                if time.monotonic() >= deadline:
                    raise
            time.sleep(POLL)

    def before_end(self) -> list[tuple[str, dict]]:
        """For a terminal event after a restart: the events before it that were missed (the
        history is given a moment for an `exited` of a turn that ran)."""
        if not self.restarts:
            return []
        deadline = time.monotonic() + HISTORY_WAIT
        events: list[tuple[str, dict]] = []
        while True:
            events += self._unseen(terminal=False)
            if "exited" in self.seen or "started" not in self.seen:
                return events  # its exit is known, or it never ran: no exited to wait for
            if time.monotonic() >= deadline:
                return events
            time.sleep(POLL)

    def _unseen(self, *, terminal: bool) -> list[tuple[str, dict]]:
        """The history's events of this turn of kinds not yet seen (terminal ones only if
        `terminal`), marked seen."""
        from ..history import db as history

        try:
            story = history.show(self.client.state_dir, self.turn_id)
        except history.HistoryError:
            return []
        events = []
        for event in story["events"] if story else []:
            kind = event["kind"]
            if kind in self.seen or (not terminal and kind in protocol.TERMINAL_EVENTS):
                continue
            topic = f"turn.{self.turn_id}.{kind}"
            events.append((topic, {"id": self.turn_id, **event["body"]}))
            if kind in protocol.TERMINAL_EVENTS:
                break
        for topic, _ in events:
            self.seen.add(_kind(topic))
        return events

    def close(self) -> None:
        self.watch.close()
