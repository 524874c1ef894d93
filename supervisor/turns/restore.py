"""Restore: what the last supervisor acknowledged (queue.json), taken back after a restart.

Design note. Nothing here sets a state. A saved item is made new and its past is replayed through
the transition table (`Ledger.apply(..., replay=True)`: advanced, not published again, because the
old supervisor already told the world); what happens to it now goes through the ending table
(`Endings.happen`) and is published like anything else. So a restored item can reach only the
states a live one can, by the same steps.

- Finished ids are remembered (supervisor.turns.finished); an id finished there is never restored.
- Turns the old supervisor was running: adopted first when their guards wait for it
  (supervisor.turns.adopt); then those granted whose command never ran are held at their key's
  head for their requesters to ask again (supervisor.turns.rerun); the others replayed to
  running; once no slot shows their work any
  more (`settle_lost`, called again by the daemon at each reap pass while any is left), their
  story ends with `exited` (CMD's own status when its guard recorded that it ended by itself,
  else reason `supervisor_restarted`), `gone`, `released`.
- Held reservations: replayed to held when the slot can be taken again, their end capped at
  now + ttl; else released (reason `requester_gone`, `expired` or `lost`).
- Waiting turns and reservations: back in the queue at their old place (request time, then id),
  with their wait deadline; cancelled (`requester_gone`) when their requester has died.
A malformed entry is skipped and named in the problems returned (the daemon publishes each).
Every entry is checked as a new request is (supervisor.wire.args): its id a turn id, its key a
cap key that is not reserved (a reservation of `_machine` would stop the start).

Knows queue.json's entries and the manager's collaborators; nothing of sockets.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from guardd.procs import Identity
from guardd.record import RecordError, read_json

from ..caps import SlotState
from ..holder import Holder
from ..slots.gate import SlotView
from ..wire.args import TurnArgs, parse_holder, parse_key, parse_turn
from ..wire.protocol import ProtocolError, check_id
from . import adopt, rerun
from .endings import What
from .requesters import GONE
from .states import Event, Item, Reservation, State, Turn

if TYPE_CHECKING:
    from .manager import Manager

STILL_HELD = (SlotState.ORPHANED, SlotState.UNREADABLE, SlotState.HELD)
MALFORMED = (TypeError, KeyError, ValueError, ProtocolError)


def restore(manager: Manager, data: dict[str, Any], slot_views: list[SlotView]) -> list[str]:
    """Take queue.json's contents back; returns the problems found. Grants nothing."""
    ledger = manager.ledger
    now = manager.clock()
    with ledger.batch():
        problems = manager.finished.load(data["finished"])
        running = []
        for entry in data["running"]:
            try:  # checked as a request's id and key are (a key `../../x` names a directory)
                check_id(entry["id"])
                parse_key(entry["key"])
            except MALFORMED as e:
                problems.append(f"running entry {str(entry)[:200]} is malformed: {e}")
                continue
            if entry["id"] not in manager.finished:
                running.append(entry)
        # First: what still runs is adopted before anything is granted (supervisor.turns.adopt).
        lost, adoption_problems, manager.adoption = adopt.adopt_running(
            manager, running, slot_views
        )
        problems += adoption_problems
        # Then: granted, never started, held for their requesters (supervisor.turns.rerun).
        held = {entry["id"] for entry in rerun.held_ones(manager, lost, slot_views)}
        for entry in lost:
            if entry["id"] in held:
                problem = rerun.hold(manager, entry)
                if problem is None:
                    continue
                problems.append(problem)
            ledger.lost_running.append({"id": entry["id"], "key": entry["key"]})
        settle_lost(manager, slot_views)
        for entry in data["reservations"]:
            try:
                _reservation(manager, entry, now)
            except MALFORMED as e:
                problems.append(f"reservation entry {str(entry)[:200]} is malformed: {e}")
        for entry in data["waiting"]:
            try:
                _waiting_turn(manager, entry)
            except MALFORMED as e:
                shown = entry.get("id") if isinstance(entry, dict) else entry
                problems.append(f"waiting entry {str(shown)[:200]} is malformed: {e}")
    ledger.save_all()
    return problems


def _ended_meanwhile(guards: Path, ids: set[str]) -> dict[str, dict[str, Any]]:
    """The guard records, by turn, of these turns whose command ended by itself while no supervisor
    ran (the record is `gone`, reason `exited`, and holds the exit): their `exited` says the
    command's own status, not `supervisor_restarted` (work its guard ended because its supervisor
    was gone, `parent_gone` or `not_adopted`, still reads as that). Each record read bounded
    (guardd.record.read_json: no symlink, no FIFO followed); one that cannot be read is passed
    over (the turn ends as a lost one)."""
    if not ids:
        return {}
    found: dict[str, dict[str, Any]] = {}
    try:
        names = [n for n in os.listdir(guards) if n.endswith(".json")]
    except OSError:
        return found
    for name in names:
        try:
            record = read_json(guards / name)
        except (OSError, RecordError):
            continue
        turn = record.get("turn")
        if (
            turn in ids
            and record.get("state") == "gone"
            and record.get("reason") == "exited"  # by itself: not ended for its supervisor's loss
            and isinstance(record.get("exit"), dict)
        ):
            found[turn] = record
    return found


def settle_lost(manager: Manager, slot_views: list[SlotView]) -> None:
    """End the story of a dead supervisor's turns once no slot shows their work any more."""
    still_held = {v.turn for v in slot_views if v.state in STILL_HELD and v.turn}
    ledger = manager.ledger
    lost, ledger.lost_running = ledger.lost_running, []
    # Read when its slot frees (at the start, and at each later settle): a guard that was not
    # adopted (it did not answer in time) may have seen its command end by itself since.
    ended = _ended_meanwhile(manager.paths.guards, {e["id"] for e in lost} - still_held)
    with ledger.batch():
        for entry in lost:
            if entry["id"] in still_held:
                ledger.lost_running.append(entry)
                continue
            turn = Turn(entry["id"], entry["key"], [], None, {}, Holder())
            for event in (Event.QUEUED, Event.GRANTED, Event.STARTED):
                ledger.apply(turn, event, replay=True)
            # its guard's record, when its command ended by itself while none ran
            record = ended.get(entry["id"])
            if record is not None:
                started = record.get("started_at")  # the guard's start: wall_s is its run
                if isinstance(started, int | float) and not isinstance(started, bool):
                    manager.endings.running(turn, None, started_at=float(started))
                manager.endings.happen(turn, What.EXIT_KNOWN, record=record)
            else:
                manager.endings.happen(turn, What.EXIT_KNOWN, reason="supervisor_restarted")
            manager.endings.happen(turn, What.WORK_GONE)


def _reservation(manager: Manager, entry: dict[str, Any], now: float) -> None:
    holder = parse_holder(entry["holder"])
    # id and key checked as a new request's are: `_machine` or `../../x` stopped the start (exit 2)
    reservation = Reservation(
        check_id(entry["id"]),
        parse_key(entry["key"]),
        holder,
        requested_at=float(entry["requested_at"]),
    )
    if entry.get("wait_deadline") is not None:
        manager.ledger.deadlines[reservation.id] = float(entry["wait_deadline"])
    requester = manager.requesters.restored(holder)
    if entry.get("state") != State.GRANTED.value:
        _requeue(manager, reservation, requester)
        return
    until = min(float(entry["until"]), now + manager.settings.reservation_ttl)
    manager.ledger.add(reservation)
    manager.ledger.apply(reservation, Event.QUEUED, replay=True)
    if requester is not GONE and until > now:
        reservation.slot = manager.gate.try_acquire(
            reservation.key,
            holder.held_by(manager.me.pid, manager.me.start),
            reservation={"id": reservation.id, "until": until},
        )
    if reservation.slot is None:
        reason = "requester_gone" if requester is GONE else "expired" if until <= now else "lost"
        manager.ledger.apply(reservation, Event.GRANTED, replay=True)
        manager.endings.happen(reservation, What.CANCEL, reason=reason)
        return
    manager.hold(reservation, until, replay=True)
    if isinstance(requester, Identity):
        manager.watch_requester(requester, reservation)


def _waiting_turn(manager: Manager, entry: dict[str, Any]) -> None:
    args = _turn_args(entry)
    if args.id is None:
        raise ValueError("it has no 'id'")
    turn = Turn(
        args.id,
        args.key,
        args.argv,
        args.cwd,
        args.env,
        args.holder,
        requested_at=float(entry["requested_at"]),
        reservation=args.reservation,
        timeout=args.timeout,
        env_replace=args.env_replace,
        stdin=args.stdin,
        winsize=args.winsize,
    )
    if entry.get("wait_deadline") is not None:
        manager.ledger.deadlines[turn.id] = float(entry["wait_deadline"])
    _requeue(manager, turn, manager.requesters.restored(args.holder))


def _requeue(manager: Manager, item: Item, requester: Identity | None | bool) -> None:
    """A restored waiter back in the queue at its old place, unless its requester is gone."""
    manager.ledger.add(item)
    manager.queue.add(item.key, item.id, item.requested_at)
    manager.ledger.apply(item, Event.QUEUED, replay=True)
    if requester is GONE:
        manager.endings.happen(item, What.CANCEL, reason="requester_gone")
        return
    manager.wait_limit(item)
    if isinstance(requester, Identity):
        manager.watch_requester(requester, item)


def _turn_args(entry: dict[str, Any]) -> TurnArgs:
    """A waiting turn from queue.json, checked as strictly as a new request."""
    # env_replace, stdin and winsize are absent in a queue.json of the release before adoption (the
    # release before, tests/system/test_upgrade.py): left out, as a request without them, they
    # take their defaults (passed as None they were refused, and the old release's waiters lost)
    names = (
        *("id", "key", "argv", "cwd", "env", "holder", "reservation", "timeout"),
        *("env_replace", "stdin", "winsize"),
    )
    return parse_turn({name: entry[name] for name in names if name in entry})
