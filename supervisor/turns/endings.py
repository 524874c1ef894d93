"""A granted turn's life after its grant, and every ending, as one table (s6's actions[state][event]).

Design note. What can happen to an item once it exists — cancelled (by a client, a wait timeout,
its requester's death, shutdown), a reservation's time running out, its guard failing to start,
starting, a hint from its guard, its guard's process ending, its work confirmed gone — is a `What`.
Where the item is in its life is a `Phase` (derived from its state and whether its outcome is
known). `ACTIONS[(phase, what)]` names the action; `Endings.happen` is the one function that looks
it up and runs it. Every action changes states only through `Ledger.apply` (the transition table
of supervisor.turns.states). A pair missing from ACTIONS is a bug and raises IllegalTransition; pairs that
rightly do nothing (a hint about a turn already gone) say NOTHING explicitly.

Capacity comes back in one place, `_release` (after `confirm_gone`, supervisor.turns.gone), and a
reservation's in `_release_reservation`; both then call `on_capacity` (the manager grants the next
waiter). A turn's terminal event is published from there, through the ledger's `_finish`.

Starting a turn's guard is supervisor.turns.starting's (`Starter`): it reports here through `happen`
(START_FAILED, STARTED, CANCEL when the guard runs but cannot be followed or recorded, and
GUARD_ENDED), and tells `running` the guard's cgroup and start time. A cancel while STARTING is
kept (`turn.stop_reason`) and acted on once STARTED; a guard whose exit cannot be followed
(`turn.followed` False) is watched for its end by `tick`.

Knows items' phases, guards (supervisor.turns.seams's interface), slots' `release`/`record_work`, and
guard records; nothing of queue order, grants, sockets, or how a guard is started.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable
from typing import Any

from guardd import procs
from guardd.procs import Group
from guardd.record import RecordError, read_json, record_groups, spare_file

from ..guards import containment
from ..guards.handle import STATUS_UNKNOWN
from .gone import Probe, confirm_gone
from .ledger import Ledger
from .seams import GuardSettings
from .states import Event, IllegalTransition, Item, Outcome, Reservation, State, Turn

log = logging.getLogger("ccsup.endings")

GROUPS_BATCH = 0.05  # seconds: group hints of a turn are taken together, at most this often
SLOT_GROUPS_ALWAYS = 64  # a slot record with up to this many groups is rewritten at every batch
SLOT_GROUPS_EVERY = 1.0  # seconds: beyond that, at most this often (the guard record has them all)
GROUP_EVENTS_AT_ONCE = 200  # turn.<id>.group events published in one go (~20 us each)


class Phase(enum.Enum):
    WAITING = "waiting"  # queued: holds nothing
    AWAITING = "awaiting"  # granted before a crash, guard never started: held for its requester
    HELD = "held"  # a reservation holding its slot
    STARTING = "starting"  # granted; its guard not started yet
    RUNNING = "running"
    STOPPING = "stopping"  # asked to stop; outcome not known yet
    ENDING = "ending"  # outcome known (exited published); work not yet confirmed gone
    GONE = "gone"  # work confirmed gone, or finished: nothing is left to do


class What(enum.Enum):
    CANCEL = "cancel"  # a client, shutdown, a dead requester: `reason` says which
    WAIT_TIMEOUT = "wait_timeout"
    EXPIRED = "expired"  # a held reservation's time is up
    START_FAILED = "start_failed"
    STARTED = "started"
    GROUP_HINT = "group_hint"  # guard.<turn>.group (checked against the record)
    EXIT_KNOWN = "exit_known"  # the record, the guard's status, or the restart says how CMD ended
    GONE_HINT = "gone_hint"  # guard.<turn>.gone with a record that says gone
    GUARD_ENDED = "guard_ended"  # the guard process was reaped
    WORK_GONE = "work_gone"  # confirm_gone said so


class Action(enum.Enum):
    NOTHING = "nothing"
    DEQUEUE = "dequeue"  # cancelled while waiting: takes nothing
    END_HELD = "end_held"  # a held turn not asked again: its story ends (exited, gone, released)
    RELEASE_RESERVATION = "release_reservation"
    STOP_WHEN_STARTED = "stop_when_started"
    START = "start"
    FAIL_START = "fail_start"
    STOP = "stop"  # stopping published; the guard asked to end the turn
    STOP_AGAIN = "stop_again"  # already ending: ask the guard again (costs nothing)
    PUBLISH_GROUPS = "publish_groups"
    PUBLISH_EXIT = "publish_exit"
    CONFIRM = "confirm"  # look whether the work is gone (the guard still runs)
    REAPED = "reaped"  # learn the outcome from the record or status, then confirm
    RELEASE = "release"  # gone, released, the slot freed
    DROP_RECORD = "drop_record"


P, W, A = Phase, What, Action
ACTIONS: dict[tuple[Phase, What], Action] = {
    (P.WAITING, W.CANCEL): A.DEQUEUE,
    (P.WAITING, W.WAIT_TIMEOUT): A.DEQUEUE,
    (P.AWAITING, W.CANCEL): A.END_HELD,  # its requester gone, not asked again in time, a cancel
    (P.AWAITING, W.WAIT_TIMEOUT): A.NOTHING,  # it was granted once: no wait limit applies
    (P.HELD, W.CANCEL): A.RELEASE_RESERVATION,
    (P.HELD, W.EXPIRED): A.RELEASE_RESERVATION,
    (P.HELD, W.WAIT_TIMEOUT): A.NOTHING,  # granted before its timer fired
    (P.STARTING, W.CANCEL): A.STOP_WHEN_STARTED,
    (P.STARTING, W.START_FAILED): A.FAIL_START,
    (P.STARTING, W.STARTED): A.START,
    (P.STARTING, W.WAIT_TIMEOUT): A.NOTHING,
    (P.RUNNING, W.CANCEL): A.STOP,
    (P.STOPPING, W.CANCEL): A.STOP_AGAIN,
    (P.ENDING, W.CANCEL): A.STOP_AGAIN,
    (P.GONE, W.CANCEL): A.NOTHING,
    (P.GONE, W.EXPIRED): A.NOTHING,
    (P.GONE, W.WAIT_TIMEOUT): A.NOTHING,
    (P.RUNNING, W.GROUP_HINT): A.PUBLISH_GROUPS,
    (P.STOPPING, W.GROUP_HINT): A.PUBLISH_GROUPS,
    (P.ENDING, W.GROUP_HINT): A.PUBLISH_GROUPS,
    (P.GONE, W.GROUP_HINT): A.NOTHING,
    (P.RUNNING, W.EXIT_KNOWN): A.PUBLISH_EXIT,
    (P.STOPPING, W.EXIT_KNOWN): A.PUBLISH_EXIT,
    (P.ENDING, W.EXIT_KNOWN): A.NOTHING,  # published once
    (P.GONE, W.EXIT_KNOWN): A.NOTHING,
    (P.RUNNING, W.GONE_HINT): A.CONFIRM,
    (P.STOPPING, W.GONE_HINT): A.CONFIRM,
    (P.ENDING, W.GONE_HINT): A.CONFIRM,
    (P.GONE, W.GONE_HINT): A.NOTHING,
    (P.RUNNING, W.GUARD_ENDED): A.REAPED,
    (P.STOPPING, W.GUARD_ENDED): A.REAPED,
    (P.ENDING, W.GUARD_ENDED): A.REAPED,
    (P.GONE, W.GUARD_ENDED): A.DROP_RECORD,
    (P.RUNNING, W.WORK_GONE): A.NOTHING,  # outcome unknown: the guard's end brings it
    (P.STOPPING, W.WORK_GONE): A.NOTHING,
    (P.ENDING, W.WORK_GONE): A.RELEASE,
    (P.GONE, W.WORK_GONE): A.NOTHING,
}
del P, W, A


def phase_of(item: Item) -> Phase:
    state = item.state
    if state is State.QUEUED:
        held = isinstance(item, Turn) and item.held_until is not None
        return Phase.AWAITING if held else Phase.WAITING
    if isinstance(item, Reservation):
        return Phase.HELD if state is State.GRANTED else Phase.GONE
    return {
        State.GRANTED: Phase.STARTING,
        State.RUNNING: Phase.RUNNING,
        State.STOPPING: Phase.STOPPING if item.exit is None else Phase.ENDING,
        State.EXITED: Phase.ENDING,
    }.get(state, Phase.GONE)


START_FAILURES = ("not_found", "not_executable")

# Why a held turn (supervisor.turns.rerun) was not run, by the reason its end was asked with.
NOT_ASKED_AGAIN = {
    "requester_gone": "its requester is gone",
    "not_asked_again": "its requester did not ask for it again in time",
}


def start_failure(reason: object) -> tuple[str, str] | None:
    """(word, line) of a guard record's reason when CMD could not start ("not_found: nosuchcmd:
    command not found", guardd.child), else None."""
    if not isinstance(reason, str):
        return None
    word, _, line = reason.partition(": ")
    return (word, line) if word in START_FAILURES and line else None


def outcome_of(record: dict[str, Any] | None, returncode: int | None) -> Outcome | None:
    """CMD's outcome: the guard record's exit if it has one, else the guard's status (125, or an
    unknown status, is the guard's own failure: `guard_lost`); None while neither is known."""
    exit_info = (record or {}).get("exit")
    if isinstance(exit_info, dict):
        code, signal_number = exit_info.get("code"), exit_info.get("signal")
        if isinstance(signal_number, int):
            return {"code": 128 + signal_number, "signal": signal_number, "reason": None}
        if isinstance(code, int):
            failed = start_failure((record or {}).get("reason"))
            if failed is not None:
                return {"code": code, "signal": None, "reason": failed[0], "error": failed[1]}
            return {"code": code, "signal": None, "reason": None}
    if returncode is not None and 0 <= returncode != STATUS_UNKNOWN:
        signal_number = returncode - 128 if returncode > 128 else None
        return {"code": returncode, "signal": signal_number, "reason": None}
    if returncode is not None:
        return {"code": None, "signal": None, "reason": "guard_lost"}
    return None


def _exited_at(record: dict[str, Any] | None) -> float | None:
    """When the guard reaped CMD (epoch), as its record says; None when it does not say."""
    at = (record or {}).get("exited_at")
    return float(at) if isinstance(at, int | float) and not isinstance(at, bool) else None


class Endings:
    def __init__(
        self,
        ledger: Ledger,
        *,
        settings: Callable[[], GuardSettings],
        on_capacity: Callable[[], None],
        probe: Probe,
    ):
        self.ledger = ledger
        self.settings = settings
        self.on_capacity = on_capacity
        self.probe = probe
        self._cgroup_of: dict[str, str] = {}  # turn -> its cgroup, removed after the release
        self._started_at: dict[str, float] = {}  # turn -> when its guard started (epoch)
        self._confirming: set[str] = set()
        self._confirm_again: dict[str, tuple[dict[str, Any] | None, bool]] = {}
        self._groups_due: set[str] = set()  # turns whose group hints wait to be taken
        self._slot_groups_at: dict[str, float] = {}  # turn -> when its slot record got groups
        self._run: dict[Action, Callable[..., None]] = {
            Action.DEQUEUE: self._dequeue,
            Action.END_HELD: self._end_held,
            Action.RELEASE_RESERVATION: self._release_reservation,
            Action.STOP_WHEN_STARTED: self._stop_when_started,
            Action.START: self._start,
            Action.FAIL_START: self._fail_start,
            Action.STOP: self._stop,
            Action.STOP_AGAIN: self._stop_again,
            Action.PUBLISH_GROUPS: self._publish_groups,
            Action.PUBLISH_EXIT: self._publish_exit,
            Action.CONFIRM: self._confirm,
            Action.REAPED: self._reaped,
            Action.RELEASE: self._release,
            Action.DROP_RECORD: self._drop_record,
        }

    def happen(
        self,
        item: Item,
        what: What,
        *,
        reason: str | None = None,
        record: dict[str, Any] | None = None,
        returncode: int | None = None,
    ) -> None:
        """The one function that applies ACTIONS."""
        phase = phase_of(item)
        action = ACTIONS.get((phase, what))
        if action is None:
            raise IllegalTransition(f"{item.id} in phase {phase.value} cannot take {what.value}")
        if action is Action.NOTHING:
            return
        if isinstance(item, Reservation):
            assert action in (Action.DEQUEUE, Action.RELEASE_RESERVATION), action
        self._run[action](item, reason=reason, record=record, returncode=returncode)

    def happen_to(self, item_id: str, what: What, reason: str | None = None) -> None:
        """For timers and watchers that hold an id: the item may have finished since."""
        item = self.ledger.get(item_id)
        if item is not None:
            self.happen(item, what, reason=reason)

    # -- actions (one per Action; each takes the same keywords) -----------------------------------

    def _dequeue(self, item: Item, *, reason: str | None, **_: Any) -> None:
        self.ledger.queue.remove(item.id)
        self.ledger.apply(item, Event.CANCELLED, reason=reason)

    def _end_held(self, turn: Turn, *, reason: str | None, **_: Any) -> None:
        """A turn held for its requester (supervisor.turns.rerun) that is not asked again: its
        story ends as a lost one's (`exited` with `supervisor_restarted` and a `detail` saying
        why, `gone`, `released`: its `granted` was told by the supervisor that died); a cancel or
        a shutdown is its stop reason. It held no slot; its key's next waiter may go now."""
        self.ledger.queue.remove(turn.id)
        self.ledger.cancel_timer(turn.id)
        turn.held_until = None
        self.ledger.apply(turn, Event.GRANTED, replay=True)  # told by the supervisor that died
        words = NOT_ASKED_AGAIN.get(reason or "")
        if words is None:
            turn.stop_reason = reason
        detail = f"its guard had not started when its supervisor died, and {words or reason}"
        turn.exit = {"code": None, "signal": None, "reason": "supervisor_restarted"}
        turn.exited_at = self.ledger.clock()
        self.ledger.apply(turn, Event.EXITED, **turn.exit, detail=detail)
        self._release(turn)
        self.on_capacity()

    def _release_reservation(
        self, reservation: Reservation, *, reason: str | None, **_: Any
    ) -> None:
        log.info("reservation %s released (%s)", reservation.id, reason)
        slot, reservation.slot = reservation.slot, None
        index = slot.index if slot is not None else None
        if slot is not None:
            slot.release()
        self.ledger.apply(reservation, Event.RELEASED, reason=reason, index=index)
        if slot is not None:
            self.on_capacity()

    def _stop_when_started(self, turn: Turn, *, reason: str | None, **_: Any) -> None:
        turn.stop_reason = reason

    def _start(self, turn: Turn, **_: Any) -> None:
        assert turn.guard is not None
        self.ledger.apply(turn, Event.STARTED, guard=turn.guard.identity.to_json())
        if turn.stop_reason is not None:
            self._stop(turn, reason=turn.stop_reason)

    def _fail_start(self, turn: Turn, *, reason: str | None, **_: Any) -> None:
        turn.exit = {"code": None, "signal": None, "reason": reason}
        turn.exited_at = self.ledger.clock()
        self.ledger.apply(turn, Event.EXITED, **turn.exit)
        self._release(turn)

    def _stop(self, turn: Turn, *, reason: str | None, **_: Any) -> None:
        assert turn.guard is not None
        turn.stop_reason = reason
        self.ledger.apply(turn, Event.STOPPING, reason=reason)
        turn.guard.terminate()

    def _stop_again(self, turn: Turn, **_: Any) -> None:
        if turn.guard is not None:
            turn.guard.terminate()

    def _publish_groups(self, turn: Turn, *, record: dict[str, Any] | None, **_: Any) -> None:
        groups: list[Group] = record_groups(record) if record else []
        new = [group for group in groups if group not in turn.groups_seen]
        for group in new[:GROUP_EVENTS_AT_ONCE]:
            turn.groups_seen.add(group)
            self.ledger.emit(f"turn.{turn.id}.group", {"id": turn.id, **group.to_json()})
        if len(new) > GROUP_EVENTS_AT_ONCE:
            self.groups_hinted(turn, 0.0)  # the rest next round: the loop serves others between
            return
        if turn.slot is not None and turn.guard is not None:
            now = time.monotonic()
            since = now - self._slot_groups_at.get(turn.id, 0.0)
            if len(groups) <= SLOT_GROUPS_ALWAYS or since >= SLOT_GROUPS_EVERY:
                self._slot_groups_at[turn.id] = now
                turn.slot.record_work(
                    turn.guard.identity,
                    str(turn.guard.record_path),
                    groups,
                    cgroup=self._cgroup_of.get(turn.id),
                )
            else:  # the last groups still reach the slot record, a little later
                self.groups_hinted(turn, SLOT_GROUPS_EVERY - since)

    def groups_hinted(self, turn: Turn, delay: float = GROUPS_BATCH) -> None:
        """A turn forking hundreds of groups sends a hint for each: its record is read (in a
        thread) at most once per GROUPS_BATCH, not once per hint on the loop (that was groups^2),
        and its slot record rewritten (an fsync, ~8 ms with 800 groups) at most once per
        SLOT_GROUPS_EVERY once it holds more than SLOT_GROUPS_ALWAYS groups."""
        if turn.id in self._groups_due:
            return
        self._groups_due.add(turn.id)
        asyncio.get_running_loop().create_task(self._take_group_hints(turn, delay))

    async def _take_group_hints(self, turn: Turn, delay: float) -> None:
        try:
            await asyncio.sleep(delay)
            if turn.guard is None:
                return
            record = await asyncio.to_thread(containment.read_record, turn.guard.record_path)
        finally:
            self._groups_due.discard(turn.id)
        if record is not None and turn.id in self.ledger.turns and phase_of(turn) is not Phase.GONE:
            self.happen(turn, What.GROUP_HINT, record=record)

    def _publish_exit(
        self,
        turn: Turn,
        *,
        reason: str | None,
        record: dict[str, Any] | None,
        returncode: int | None,
    ) -> None:
        if turn.exit is not None:
            self._tell_leftovers(turn, record)
            return  # stopping, and already told
        outcome: Outcome | None = (
            {"code": None, "signal": None, "reason": reason}
            if reason is not None
            else outcome_of(record, returncode)
        )
        if outcome is None:
            return
        if turn.stop_reason == "timeout" and outcome["reason"] is None:
            outcome = {**outcome, "reason": "timeout"}  # stopped at its runtime limit (keyctl)
        if turn.guard is not None:
            turn.guard.drain()  # output first, then the outcome
        if outcome["reason"] is None and containment.oom_killed(self._cgroup_of.get(turn.id)):
            outcome = {**outcome, "reason": "oom"}  # the memory limit ended it
        turn.exit = outcome
        # The guard's own time of CMD's end when its record has it: a turn that ended while no
        # supervisor ran ends then, not when a later one settles it.
        exited_at = _exited_at(record) if reason is None else None
        turn.exited_at = exited_at if exited_at is not None else self.ledger.clock()
        used = containment.usage_fields(
            record, turn.requested_at, self._started_at.get(turn.id), turn.exited_at
        )
        dated: dict[str, Any] = {} if exited_at is None else {"exited_at": exited_at}
        self.ledger.apply(turn, Event.EXITED, **outcome, **used, **dated)
        self._tell_leftovers(turn, record)

    def _tell_leftovers(self, turn: Turn, record: dict[str, Any] | None) -> None:
        """`turn.<id>.leftovers` once, from the guard record that names them (the guard writes
        them with CMD's exit, before it ends them: guardd.leftovers); after `exited`."""
        left = (record or {}).get("leftovers")
        if turn.leftovers_told or not isinstance(left, dict) or turn.exit is None:
            return
        turn.leftovers_told = True
        names = left.get("names")
        self.ledger.emit(
            f"turn.{turn.id}.leftovers",
            {
                **turn.fields(),
                "count": left.get("count"),
                "names": names if isinstance(names, list) else [],
            },
        )

    def _confirm(self, turn: Turn, *, record: dict[str, Any] | None, **_: Any) -> None:
        asyncio.get_running_loop().create_task(self._confirm_gone(turn, record, guard_done=False))

    def _reaped(self, turn: Turn, **_: Any) -> None:
        assert turn.guard is not None
        record = self._read_guard_record(turn)
        self.happen(turn, What.EXIT_KNOWN, record=record, returncode=turn.guard.returncode)
        self._tell_leftovers(turn, record)  # its final record: exit_known may do nothing now
        asyncio.get_running_loop().create_task(self._confirm_gone(turn, record, guard_done=True))

    def _release(self, turn: Turn, **_: Any) -> None:
        self._slot_groups_at.pop(turn.id, None)
        self._started_at.pop(turn.id, None)
        slot = turn.slot
        index = slot.index if slot is not None else None
        if slot is not None:
            slot.release()
        containment.remove_cgroup(self._cgroup_of.pop(turn.id, None))  # empty: confirmed gone
        with self.ledger.batch():
            self.ledger.apply(turn, Event.GONE)
            self.ledger.apply(turn, Event.RELEASED, index=index)
        if turn.guard is not None and turn.guard.returncode is not None:
            self._drop_record(turn)
        if slot is not None:
            self.on_capacity()

    def _drop_record(self, turn: Turn, **_: Any) -> None:
        """Once the work is confirmed gone and the guard reaped, or its record says gone (its
        last write), the record serves nobody. Once a turn: three ends lead here."""
        assert turn.guard is not None
        if turn.record_dropped:
            return
        turn.record_dropped = True
        self.ledger.files.unlink_soon(turn.guard.record_path)  # off the loop: see filework
        returncode = turn.guard.returncode
        if returncode is not None and (returncode < 0 or returncode == STATUS_UNKNOWN):
            # Killed (or not known to have ended on its own): it may have left its record's spare.
            self.ledger.files.unlink_soon(spare_file(turn.guard.record_path))

    # -- confirmed gone --------------------------------------------------------------------------

    async def _confirm_gone(
        self, turn: Turn, record: dict[str, Any] | None, *, guard_done: bool
    ) -> None:
        if turn.id in self._confirming:
            # Judged in a thread, so one may be under way: look again when it is done.
            _, done_before = self._confirm_again.get(turn.id, (None, False))
            self._confirm_again[turn.id] = (record, guard_done or done_before)
            return
        self._confirming.add(turn.id)
        try:
            gone = await confirm_gone(
                record,
                turn.id,
                guard_done=guard_done,
                grace=self.settings().grace,
                probe=self.probe,
                **({"cgroup": self._cgroup_of[turn.id]} if turn.id in self._cgroup_of else {}),
            )
            if gone:
                returncode = turn.guard.returncode if guard_done and turn.guard else None
                self.happen(turn, What.EXIT_KNOWN, record=record, returncode=returncode)
                self._tell_leftovers(turn, record)
                self.happen(turn, What.WORK_GONE)
                if turn.guard is not None and (record or {}).get("state") == "gone":
                    # "gone" is a guard's last write: its record serves nobody any more, even
                    # if the guard is still on its way out (a stop may end before it is reaped).
                    self._drop_record(turn)
        finally:
            self._confirming.discard(turn.id)
            self._confirm_later(turn)

    def _confirm_later(self, turn: Turn) -> None:
        again = self._confirm_again.pop(turn.id, None)
        if again is not None and turn.id in self.ledger.turns and phase_of(turn) is not Phase.GONE:
            record, guard_done = again
            asyncio.get_running_loop().create_task(
                self._confirm_gone(turn, record, guard_done=guard_done)
            )

    # -- the guard -------------------------------------------------------------------------------

    def running(self, turn: Turn, cgroup: str | None, started_at: float | None = None) -> None:
        """Its guard runs (supervisor.turns.starting; or it was adopted, started_at then the guard's
        own start): its start time and cgroup, kept to its release."""
        self._started_at[turn.id] = self.ledger.clock() if started_at is None else started_at
        if cgroup is not None:
            self._cgroup_of[turn.id] = cgroup

    def started_at(self, turn_id: str) -> float | None:
        """When the running turn's guard started (an adopted turn's: its first start, not the
        adoption), for `ps`'s AGE; None when it does not run."""
        return self._started_at.get(turn_id)

    def _read_guard_record(self, turn: Turn) -> dict[str, Any] | None:
        assert turn.guard is not None
        try:
            return read_json(turn.guard.record_path)
        except (FileNotFoundError, RecordError) as e:
            log.info("turn %s: no usable guard record (%s)", turn.id, e)
            return None

    def on_hint(self, turn_id: str, kind: str) -> None:
        """A hint is a reason to look, never a fact: everything is checked against the record."""
        turn = self.ledger.turns.get(turn_id)
        if turn is None or turn.guard is None or phase_of(turn) is Phase.GONE:
            return
        if kind == "group":
            self.groups_hinted(turn)  # the record is read later, once for many hints
            return
        record = self._read_guard_record(turn)
        if record is None:
            return
        if kind == "exited" and outcome_of(record, None) is not None:
            self.happen(turn, What.EXIT_KNOWN, record=record)
        elif kind == "gone" and record.get("state") == "gone":
            self.happen(turn, What.GONE_HINT, record=record)

    def tick(self) -> None:
        """Periodic: pending terminations, unfollowed guards' ends, unconfirmed ends looked at again.

        One turn that raises does not keep the others from being looked at: the first error is
        raised once every turn was (the daemon logs and counts it, and calls again next time)."""
        failure: Exception | None = None
        for turn in list(self.ledger.turns.values()):
            try:
                self._look_again(turn)
            except Exception as e:  # noqa: BLE001 -- raised after the others were looked at
                log.error("unable to look again at the end of turn %s: %r", turn.id, e)
                failure = failure or e
        if failure is not None:
            raise failure

    def _look_again(self, turn: Turn) -> None:
        guard = turn.guard
        if guard is not None:
            guard.terminate_if_pending()
            if not turn.followed and guard.returncode is None:
                if not procs.process_running(guard.identity):
                    if guard.reap() is None:
                        guard.returncode = STATUS_UNKNOWN  # its status cannot reach us
                    guard.close()
                    self.happen(turn, What.GUARD_ENDED)
            elif (
                guard.returncode is not None
                and turn.id not in self._confirming
                and turn.state in (State.EXITED, State.STOPPING)
            ):
                record = self._read_guard_record(turn)
                asyncio.get_running_loop().create_task(
                    self._confirm_gone(turn, record, guard_done=True)
                )
