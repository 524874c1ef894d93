"""The manager decides: turns from request to release, fair grants, and confirmed gone.

Design note. Everything that happens to a turn — a control command, a bus request, a guard's hint,
a guard's pidfd turning readable, a requester dying, a wait timing out — ends up in a method here
that applies one event through `turns.next_state` and publishes it. That keeps each turn's events
once, in order, and makes an impossible pair an exception instead of a silent no-op.

Capacity comes back only on a confirmed gone: a hint (`guard.<turn>.gone`) or the guard's exit
only makes the manager *look*; it reads the guard's record and judges every group itself with
guardd's group liveness. A forged hint finds live groups and changes nothing. A guard that died
without ending its work (SIGKILL, or 125) has its recorded groups ended here, in a thread, and the
slot stays held until they are gone.

Grants: the head of each key's queue, keys taken oldest head first; a slot freed wakes one waiter
of its key (and, with a machine cap, possibly of another key). Slots freed by other processes on
the machine are noticed by a short periodic retry while anyone waits.

Reservations wait in the same queue as turns and hold a slot (state `reserved` in ps) until a turn
binds it, it expires, or it is cancelled. A holder (session + agent) has at most one per key.

A guard's record is removed once its turn is released and the guard reaped: it is kept exactly as
long as it can tell a reaper what to end.

State: everything acknowledged is saved to `queue.json` (supervisor.store) before the answer goes
out: waiting turns and reservations, and the turns granted (saved before their guard starts, so a
crash can never make a restarted supervisor run a turn twice); finished ids (ten minutes) are
appended to `finished.log`. `restore` takes that file back after a restart: finished ids are remembered, the turns
the old supervisor was running get their story ended (`exited` with reason
`supervisor_restarted`, `gone`, `released`) once no slot shows their work, held reservations
take a slot again (their end capped at now + ttl) or are released as `lost`, and waiting items
are queued again in their old order unless their requester or their wait deadline is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import cast

from guardd import procs
from guardd.record import RecordError, read_json, record_groups

from . import __version__, containment, reaper, spawn, store
from .paths import StatePaths
from .protocol import HolderInfo, ProtocolError, ReserveArgs, SendArgs, TurnArgs, parse_holder
from .slots import Holder, SlotGate
from .turns import Event, Reservation, State, Turn
from .waits import WaitQueue

log = logging.getLogger("ccsup.manager")

FINISHED_MEMORY = 600.0  # seconds a finished id is remembered
# Events after which queue.json must change: the file is saved before they are published, so a
# crash can lose an announcement but never make a restarted supervisor announce or run it again.
PERSISTED = frozenset(
    {Event.QUEUED, Event.GRANTED, Event.CANCELLED, Event.RELEASED, Event.REJECTED}
)
RETRY_INTERVAL = 0.25  # how often waiters retry slots that other processes may have freed
GROUPS_BATCH = 0.05  # seconds: group hints of a turn are taken together, at most this often
SLOT_GROUPS_ALWAYS = 64  # a slot record with up to this many groups is rewritten at every batch
SLOT_GROUPS_EVERY = 1.0  # seconds: beyond that, at most this often (the guard record has them all)


@dataclass
class Settings:
    grace: float
    scan: float
    bus_in: str | None
    config_source: str
    reservation_ttl: float = 60.0


def exit_from_record(record: dict | None) -> dict | None:
    """CMD's outcome as events give it: code as a shell reports it (128+N for signal N)."""
    exit_info = (record or {}).get("exit")
    if not isinstance(exit_info, dict):
        return None
    code, signal_number = exit_info.get("code"), exit_info.get("signal")
    if isinstance(signal_number, int):
        return {"code": 128 + signal_number, "signal": signal_number, "reason": None}
    if isinstance(code, int):
        return {"code": code, "signal": None, "reason": None}
    return None


class Manager:
    def __init__(
        self,
        *,
        paths: StatePaths,
        gate: SlotGate,
        publish: Callable[[str, dict], None],
        settings: Settings,
        clock: Callable[[], float] = time.time,
        start_guard=spawn.start_guard,
    ):
        self.paths = paths
        self.gate = gate
        self.publish = publish
        self.settings = settings
        self.clock = clock
        self.start_guard = start_guard
        self.turns: dict[str, Turn] = {}
        self.reservations: dict[str, Reservation] = {}
        self.finished: dict[str, tuple[str, float]] = {}
        self.queue = WaitQueue()
        self.stopping = False
        self.lost_running: list[dict] = []  # a dead supervisor's turns whose work is not yet gone
        self.started_at = clock()
        self.me = procs.identity_of(os.getpid())
        self._holders: dict[tuple, str] = {}  # (session, agent, key) -> reservation id
        self._requesters: dict[procs.Identity, tuple[int, set[str]]] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._deadlines: dict[str, float] = {}  # wait deadlines (epoch), for queue.json
        self._confirming: set[str] = set()
        self._confirm_again: dict[str, tuple[dict | None, bool]] = {}  # asked while confirming
        self._slot_groups_at: dict[str, float] = {}  # turn -> when its slot record got groups
        self._groups_due: set[str] = set()  # turns whose group hints wait to be taken
        self._pending: list[tuple[str, dict]] = []  # events held back until the batch is saved
        self._must_save = False
        self._batch_depth = 0
        self._finished_appended = 0  # lines appended to finished.log since it was last compacted
        self._idle = asyncio.Event()
        self._idle.set()

    # -- events ----------------------------------------------------------------------------------

    def _apply(self, item: Turn | Reservation, event: Event, **fields) -> None:
        """The one place a turn or reservation changes state: advance, save if needed, publish."""
        item.advance(event)
        if item.state.terminal:
            self._finish(item)
        self._must_save |= event in PERSISTED
        self._emit(f"turn.{item.id}.{event.value}", {**item.fields(), **fields})

    def _emit(self, topic: str, body: dict) -> None:
        self._pending.append((topic, body))
        if not self._batch_depth:
            self._flush()

    def _flush(self) -> None:
        if self._must_save:
            self._must_save = False
            self.save()
        pending, self._pending = self._pending, []
        for topic, body in pending:
            self.publish(topic, body)

    @contextlib.contextmanager
    def _batch(self):
        """Several changes, one save, then their events in order."""
        self._batch_depth += 1
        try:
            yield
        finally:
            self._batch_depth -= 1
            if not self._batch_depth:
                self._flush()

    def _finish(self, item: Turn | Reservation) -> None:
        self.turns.pop(item.id, None)
        self._slot_groups_at.pop(item.id, None)
        if self.reservations.pop(item.id, None) is not None and isinstance(item, Reservation):
            if self._holders.get(item.holder_key) == item.id:
                del self._holders[item.holder_key]
        self.queue.remove(item.id)
        self._cancel_timer(item.id)
        self._deadlines.pop(item.id, None)
        self._unwatch_requester(item)
        self._remember_finished(item.id, item.state.value, self.clock())
        if not self.turns and not self.reservations:
            self._idle.set()

    def _remember_finished(self, item_id: str, state: str, at: float) -> None:
        """In memory and appended to finished.log, before the terminal event is published."""
        self.finished[item_id] = (state, at)
        self._finished_appended += 1
        try:
            store.append_finished(self.paths.finished, item_id, state, at)
        except OSError as e:
            log.error("unable to append to %s: %s", self.paths.finished, e.strerror)

    def _cancel_timer(self, item_id: str) -> None:
        timer = self._timers.pop(item_id, None)
        if timer is not None:
            timer.cancel()

    def _call_later(self, item_id: str, delay: float, callback) -> None:
        self._cancel_timer(item_id)
        self._timers[item_id] = asyncio.get_running_loop().call_later(
            max(delay, 0.0), callback, item_id
        )

    # -- queue.json ------------------------------------------------------------------------------

    def save(self) -> None:
        """Persist everything acknowledged and unfinished (atomic; see supervisor.store)."""
        waiting, running = [], []
        for turn in self.turns.values():
            if turn.state is State.QUEUED:
                waiting.append(turn.to_json(self._deadlines.get(turn.id)))
            else:
                running.append({"id": turn.id, "key": turn.key})
        running += self.lost_running
        reservations = [r.to_json(self._deadlines.get(r.id)) for r in self.reservations.values()]
        try:
            store.save(
                self.paths.queue, waiting=waiting, reservations=reservations, running=running
            )
        except OSError as e:
            log.error(
                "unable to save %s: %s (what waits is kept in memory)", self.paths.queue, e.strerror
            )

    # -- requests --------------------------------------------------------------------------------

    def request_turn(self, args: TurnArgs) -> dict:
        turn_id = args.id or uuid.uuid4().hex
        known = self._known(turn_id, args.key)
        if known is not None:
            return known
        if self.stopping:
            raise ProtocolError("stopping", "the supervisor is stopping and takes no new turns")
        if args.cwd is not None and not os.path.isdir(args.cwd):
            raise ProtocolError("bad_request", f"'cwd' {args.cwd[:200]!r} is not a directory")
        reservation = self.reservations.get(args.reservation) if args.reservation else None
        if reservation is not None:
            self._check_binding(reservation, args)
        requester = self._requester_identity(args.holder)
        turn = Turn(
            id=turn_id,
            key=args.key,
            argv=args.argv,
            cwd=args.cwd,
            env=args.env,
            holder=args.holder,
            requested_at=self.clock(),
            wait_timeout=args.wait_timeout,
            reservation=args.reservation,
        )
        self.turns[turn_id] = turn
        self._idle.clear()
        if reservation is not None and reservation.state is State.GRANTED:
            self._bind_held(turn, reservation)
        else:
            with self._batch():
                if reservation is not None:  # still waiting: the turn takes its place in the queue
                    turn.requested_at = reservation.requested_at
                    self.queue.replace(reservation.id, turn.id)
                    self._apply(reservation, Event.CANCELLED, reason="bound", turn=turn.id)
                else:
                    self.queue.add(turn.key, turn_id, turn.requested_at)
                self._apply(
                    turn,
                    Event.QUEUED,
                    position=self.queue.position(turn_id),
                    holder=turn.holder.to_json(),
                )
            self._wait_limit(turn)
        if requester is not None:
            self._watch_requester(requester, turn)
        self.grant_waiters()
        return self._answer(turn)

    def _check_binding(self, reservation: Reservation, args: TurnArgs) -> None:
        if reservation.key != args.key:
            raise ProtocolError(
                "conflict",
                f"reservation {reservation.id} is for key {reservation.key}, not {args.key}",
            )
        mine = (reservation.holder.session, reservation.holder.agent)
        if mine != (None, None) and mine != (args.holder.session, args.holder.agent):
            raise ProtocolError(
                "conflict",
                f"reservation {reservation.id} belongs to session {mine[0]!r} agent {mine[1]!r}",
            )

    def _bind_held(self, turn: Turn, reservation: Reservation) -> None:
        """The turn takes the reservation's slot at once: no wait, no new grant."""
        slot, reservation.slot = reservation.slot, None
        self._cancel_timer(reservation.id)
        slot.bind(turn=turn.id, reservation=None)
        turn.slot = slot
        with self._batch():
            self._apply(turn, Event.QUEUED, position=None, holder=turn.holder.to_json())
            self._apply(reservation, Event.RELEASED, reason="bound", turn=turn.id, index=slot.index)
            self._apply(turn, Event.GRANTED, index=slot.index, reservation=reservation.id)
        self._spawn(turn)

    def _wait_limit(self, item: Turn | Reservation) -> None:
        if item.wait_timeout is not None:
            self._deadlines.setdefault(item.id, item.requested_at + item.wait_timeout)
        deadline = self._deadlines.get(item.id)
        if deadline is not None:
            self._call_later(item.id, deadline - self.clock(), self._wait_timed_out)

    def _answer(self, turn: Turn) -> dict:
        return {"id": turn.id, "state": turn.state.value, "position": self.queue.position(turn.id)}

    def _known(self, item_id: str, key: str) -> dict | None:
        """A request with an id already seen is answered, never run twice."""
        item = self.turns.get(item_id) or self.reservations.get(item_id)
        if item is not None:
            if item.key != key or isinstance(item, Reservation):
                raise ProtocolError("conflict", f"id {item_id} is already used for another request")
            return self._answer(item)
        if item_id in self.finished:
            return {"id": item_id, "state": self.finished[item_id][0], "position": None}
        return None

    def reject(self, item_id: str, reason: str) -> None:
        """A bad request that came on the bus: its answer is a rejected event."""
        if item_id in self.turns or item_id in self.reservations or item_id in self.finished:
            return  # a garbled retry of a known id changes nothing
        self._emit(f"turn.{item_id}.rejected", {"id": item_id, "reason": reason})

    def reserve(self, args: ReserveArgs) -> dict:
        res_id = args.id or uuid.uuid4().hex
        existing = self.reservations.get(res_id)
        if existing is not None:
            if existing.key != args.key:
                raise ProtocolError("conflict", f"id {res_id} is already used for another request")
            return self._reservation_answer(existing)
        if res_id in self.turns:
            raise ProtocolError("conflict", f"id {res_id} is already used for another request")
        if res_id in self.finished:
            return {
                "reservation": res_id,
                "key": args.key,
                "state": self.finished[res_id][0],
                "until": None,
                "position": None,
            }
        reservation = Reservation(
            res_id, args.key, args.holder, requested_at=self.clock(), wait_timeout=args.wait_timeout
        )
        same_holder = self._holders.get(reservation.holder_key) if reservation.holder_key else None
        if same_holder is not None:  # one per holder and key; asking again never extends it
            return self._reservation_answer(self.reservations[same_holder])
        if self.stopping:
            raise ProtocolError(
                "stopping", "the supervisor is stopping and takes no new reservations"
            )
        requester = self._requester_identity(args.holder)
        self._queue_reservation(reservation)
        if requester is not None:
            self._watch_requester(requester, reservation)
        self.grant_waiters()
        return self._reservation_answer(reservation)

    def _queue_reservation(self, reservation: Reservation, *, announce: bool = True) -> None:
        self.reservations[reservation.id] = reservation
        if reservation.holder_key:
            self._holders[reservation.holder_key] = reservation.id
        self._idle.clear()
        self.queue.add(reservation.key, reservation.id, reservation.requested_at)
        if announce:
            self._apply(
                reservation,
                Event.QUEUED,
                position=self.queue.position(reservation.id),
                holder=reservation.holder.to_json(),
            )
        self._wait_limit(reservation)

    def _reservation_answer(self, reservation: Reservation) -> dict:
        state = {State.GRANTED: "held"}.get(reservation.state, reservation.state.value)
        return {
            "reservation": reservation.id,
            "key": reservation.key,
            "state": state,
            "until": reservation.until,
            "position": self.queue.position(reservation.id),
        }

    def _reservation_expired(self, res_id: str) -> None:
        self._timers.pop(res_id, None)
        reservation = self.reservations.get(res_id)
        if reservation is not None and reservation.state is State.GRANTED:
            self._release_reservation(reservation, "expired")

    def _release_reservation(self, reservation: Reservation, reason: str) -> None:
        log.info("reservation %s released (%s)", reservation.id, reason)
        slot, reservation.slot = reservation.slot, None
        index = slot.index
        slot.release()
        self._apply(reservation, Event.RELEASED, reason=reason, index=index)
        self.grant_waiters()

    def cancel(self, item_id: str, reason: str = "cancelled") -> dict:
        item = self.turns.get(item_id) or self.reservations.get(item_id)
        if item is None:
            if item_id in self.finished:
                return {"id": item_id, "state": self.finished[item_id][0]}
            raise ProtocolError("not_found", f"no turn or reservation {item_id}")
        if item.state is State.QUEUED:
            self.queue.remove(item_id)
            self._apply(item, Event.CANCELLED, reason=reason)
        elif isinstance(item, Reservation):
            self._release_reservation(item, reason)
        elif item.state is State.RUNNING:
            item.stop_reason = reason
            self._apply(item, Event.STOPPING, reason=reason)
            item.guard.terminate()
        elif item.state in (State.EXITED, State.STOPPING):
            item.guard.terminate()  # already ending; asking again costs nothing
        return {"id": item_id, "state": item.state.value}

    def send(self, args: SendArgs) -> dict:
        turn = self.turns.get(args.id)
        if turn is None:
            raise ProtocolError("not_found", f"no turn {args.id}")
        if turn.guard is None or turn.state is not State.RUNNING:
            raise ProtocolError(
                "failed", f"turn {args.id} is {turn.state.value}, not running: nothing to write to"
            )
        try:
            written = turn.guard.write_stdin(args.data, args.eof)
        except OSError as e:
            raise ProtocolError(
                "failed", f"unable to write to the stdin of turn {args.id}: {e}"
            ) from None
        return {"id": args.id, "written": written}

    def _wait_timed_out(self, item_id: str) -> None:
        self._timers.pop(item_id, None)
        item = self.turns.get(item_id) or self.reservations.get(item_id)
        if item is not None and item.state is State.QUEUED:
            self.cancel(item_id, reason="timeout")

    # -- requesters ------------------------------------------------------------------------------

    def _requester_identity(self, holder: HolderInfo) -> procs.Identity | None:
        if holder.pid is None:
            return None
        start = holder.start if holder.start is not None else procs.start_ticks(holder.pid)
        ident = procs.Identity(holder.pid, start) if start is not None else None
        if ident is None or not procs.process_running(ident):
            raise ProtocolError("bad_request", f"the requester (pid {holder.pid}) is not running")
        return ident

    def _watch_requester(self, ident: procs.Identity, item: Turn | Reservation) -> None:
        entry = self._requesters.get(ident)
        if entry is None:
            try:
                pidfd = os.pidfd_open(ident.pid)
            except ProcessLookupError:
                pidfd = None
            if pidfd is not None and not procs.process_running(ident):
                os.close(pidfd)
                pidfd = None
            if pidfd is None:
                self.cancel(item.id, reason="requester_gone")
                return
            entry = (pidfd, set())
            self._requesters[ident] = entry
            asyncio.get_running_loop().add_reader(pidfd, self._requester_gone, ident)
        entry[1].add(item.id)
        item.requester = ident

    def _unwatch_requester(self, item: Turn | Reservation) -> None:
        ident = item.requester
        entry = self._requesters.get(ident) if ident else None
        if entry is None:
            return
        entry[1].discard(item.id)
        if not entry[1]:
            self._close_requester(ident)

    def _close_requester(self, ident: procs.Identity) -> None:
        pidfd, _ = self._requesters.pop(ident)
        asyncio.get_running_loop().remove_reader(pidfd)
        os.close(pidfd)

    def _requester_gone(self, ident: procs.Identity) -> None:
        entry = self._requesters.get(ident)
        if entry is None:
            return
        for item_id in sorted(entry[1]):
            self.cancel(item_id, reason="requester_gone")
        if ident in self._requesters:
            self._close_requester(ident)

    # -- grants ----------------------------------------------------------------------------------

    def grant_waiters(self) -> None:
        """Grant the head of every key's queue while slots are free, oldest head first.

        Grants are saved before any guard starts: a crash in between leaves the turn in the
        `running` list of queue.json, never back in the queue to be run a second time.
        """
        if self.stopping:
            return
        granted: list[Turn] = []
        with self._batch():
            self._grant_heads(granted)
        for turn in granted:  # their grants are saved: a crash now cannot run them twice
            self._spawn(turn)

    def _grant_heads(self, granted: list) -> None:
        for key in self.queue.keys_by_age():
            while (head := self.queue.head(key)) is not None:
                item = self.turns.get(head) or self.reservations[head]
                holder = Holder(self.me.pid, self.me.start, **item.holder.labels())
                if isinstance(item, Reservation):
                    until = self.clock() + self.settings.reservation_ttl
                    slot = self.gate.try_acquire(
                        key, holder, reservation={"id": item.id, "until": until}
                    )
                else:
                    slot = self.gate.try_acquire(key, holder, turn=item.id)
                if slot is None:
                    break
                self.queue.remove(head)
                self._cancel_timer(head)
                self._deadlines.pop(head, None)
                item.slot = slot
                if slot.took_over is not None:
                    self._emit(f"slot.{slot.key}.reaped", {"key": slot.key, "index": slot.index})
                if isinstance(item, Reservation):
                    self._hold(item, until)
                else:
                    self._apply(item, Event.GRANTED, index=slot.index)
                    granted.append(item)

    def _hold(self, reservation: Reservation, until: float) -> None:
        log.info(
            "reservation %s holds %s#%d until %.3f",
            reservation.id,
            reservation.key,
            reservation.slot.index,
            until,
        )
        reservation.until = until
        self._apply(reservation, Event.GRANTED, index=reservation.slot.index, until=until)
        self._call_later(reservation.id, until - self.clock(), self._reservation_expired)

    def _spawn(self, turn: Turn) -> None:
        try:
            guard = self.start_guard(
                turn.id,
                turn.argv,
                cwd=turn.cwd,
                env=turn.env,
                record_dir=self.paths.guards,
                grace=self.settings.grace,
                scan=self.settings.scan,
                bus=self.settings.bus_in,
            )
        except OSError as e:
            turn.exit = {
                "code": None,
                "signal": None,
                "reason": f"unable to start the guard: {e.strerror or e}",
            }
            self._apply(turn, Event.EXITED, **turn.exit)
            self._release(turn)
            return
        turn.guard = guard
        turn.env = {}  # the guard has it; nothing keeps it longer
        guard.attach(
            asyncio.get_running_loop(),
            self.paths.turn_dir(turn.id),
            on_output=partial(self._on_output, turn),
            on_exit=partial(self._on_guard_exit, turn),
        )
        turn.slot.record_work(guard.identity, str(guard.record_path), [])
        self._apply(turn, Event.STARTED, guard=guard.identity.to_json())

    def _on_output(self, turn: Turn, stream: str, offset: int, data: bytes) -> None:
        self._emit(
            f"turn.{turn.id}.{stream}",
            {"id": turn.id, "offset": offset, "data": data.decode("utf-8", errors="replace")},
        )

    # -- the guard's end -------------------------------------------------------------------------

    def _read_guard_record(self, turn: Turn) -> dict | None:
        try:
            return read_json(turn.guard.record_path)
        except (FileNotFoundError, RecordError) as e:
            log.info("turn %s: no usable guard record (%s)", turn.id, e)
            return None

    def _learn_exit(self, turn: Turn, record: dict | None, returncode: int | None) -> None:
        """Publish exited once, from the record if it has it, else from the guard's status."""
        if turn.exit is not None or turn.state not in (State.RUNNING, State.STOPPING):
            return
        turn.guard.drain()  # output first, then the outcome
        recorded = exit_from_record(record)
        if recorded is not None:
            turn.exit = recorded
        elif returncode is not None and 0 <= returncode != 125:
            signal_number = returncode - 128 if returncode > 128 else None
            turn.exit = {"code": returncode, "signal": signal_number, "reason": None}
        elif returncode is not None:
            turn.exit = {"code": None, "signal": None, "reason": "guard_lost"}
        else:
            return
        self._apply(turn, Event.EXITED, **turn.exit)

    def _on_guard_exit(self, turn: Turn) -> None:
        returncode = turn.guard.reap()
        if returncode is None:
            return
        turn.guard.close()
        if turn.state.terminal or turn.state is State.GONE:
            self._drop_guard_record(turn)
            return
        record = self._read_guard_record(turn)
        self._learn_exit(turn, record, returncode)
        asyncio.get_running_loop().create_task(self._confirm_gone(turn, record, guard_done=True))

    def on_guard_hint(self, topic: str, body: dict) -> None:
        """A hint is a reason to look, never a fact: everything is checked against the record."""
        parts = topic.split(".")
        if len(parts) != 3:
            return
        turn = self.turns.get(parts[1])
        if turn is None or turn.guard is None or turn.state.terminal or turn.state is State.GONE:
            return
        kind = parts[2]
        if kind == "group":
            self._groups_hinted(turn)  # the record is read later, once for many hints
            return
        record = self._read_guard_record(turn)
        if record is None:
            return
        if kind == "exited":
            if exit_from_record(record) is not None:
                self._learn_exit(turn, record, None)
        elif kind == "gone" and record.get("state") == "gone":
            asyncio.get_running_loop().create_task(
                self._confirm_gone(turn, record, guard_done=False)
            )

    def _groups_hinted(self, turn: Turn, delay: float = GROUPS_BATCH) -> None:
        """A turn forking hundreds of groups sends a hint for each: its record is read (in a
        thread) at most once per GROUPS_BATCH, not once per hint (that was groups^2 on the loop),
        and its slot record rewritten (an fsync, ~8 ms with 800 groups) at most once per
        SLOT_GROUPS_EVERY once it holds more than SLOT_GROUPS_ALWAYS groups."""
        if turn.id in self._groups_due:
            return
        self._groups_due.add(turn.id)
        asyncio.get_running_loop().create_task(self._publish_hinted_groups(turn, delay))

    async def _publish_hinted_groups(self, turn: Turn, delay: float) -> None:
        try:
            await asyncio.sleep(delay)
            guard = cast(spawn.Guard, turn.guard)  # set before any hint is taken
            groups = await asyncio.to_thread(containment.recorded_groups, guard.record_path)
        finally:
            self._groups_due.discard(turn.id)
        if groups is None or turn.state.terminal or turn.state is State.GONE:
            return
        self._publish_new_groups(turn, groups)

    def _publish_new_groups(self, turn: Turn, groups: list) -> None:
        for group in groups:
            if group not in turn.groups_seen:
                turn.groups_seen.add(group)
                self._emit(f"turn.{turn.id}.group", {"id": turn.id, **group.to_json()})
        now = time.monotonic()
        since = now - self._slot_groups_at.get(turn.id, 0.0)
        if len(groups) <= SLOT_GROUPS_ALWAYS or since >= SLOT_GROUPS_EVERY:
            self._slot_groups_at[turn.id] = now
            turn.slot.record_work(turn.guard.identity, str(turn.guard.record_path), groups)
        else:  # the last groups still reach the slot record, a little later
            self._groups_hinted(turn, SLOT_GROUPS_EVERY - since)

    async def _confirm_gone(self, turn: Turn, record: dict | None, *, guard_done: bool) -> None:
        """Check the work is gone (ending it if the guard could not), then release the slot."""
        if turn.id in self._confirming:
            # Judged in a thread now, so one may be under way: look again when it is done.
            self._confirm_again[turn.id] = (
                record,
                guard_done or self._confirm_again.get(turn.id, (None, False))[1],
            )
            return
        self._confirming.add(turn.id)
        try:
            groups = record_groups(record) if record else []
            if guard_done:
                # The groups are always judged here. The sweep for escapees by their CCSUP_TURN
                # marker reads every process's environment, so it is done only when the guard did
                # not end its own work (killed outright, or gave up): its "gone" covers them.
                ended_by_guard = (record or {}).get("state") == "gone"
                alive = await containment.work_running(groups, turn.id, sweep=not ended_by_guard)
                if alive:
                    log.warning(
                        "turn %s: the guard ended but its work did not; ending it now", turn.id
                    )
                    ended = await asyncio.to_thread(
                        reaper.end_work, groups, turn=turn.id, grace=self.settings.grace
                    )
                    if not ended:
                        log.error(
                            "turn %s: work still alive; the slot stays held and is retried", turn.id
                        )
                        return
            elif await containment.work_running(groups, turn.id, sweep=False):
                return  # a hint that does not hold: the groups still run
            if turn.state.terminal or turn.state is State.GONE:
                return
            self._learn_exit(turn, record, None if not guard_done else turn.guard.returncode)
            if turn.exit is None:
                return  # the pidfd path will bring the outcome
            self._release(turn)
        finally:
            self._confirming.discard(turn.id)
            self._confirm_later(turn)

    def _confirm_later(self, turn: Turn) -> None:
        again = self._confirm_again.pop(turn.id, None)
        if again is not None and not (turn.state.terminal or turn.state is State.GONE):
            record, guard_done = again
            asyncio.get_running_loop().create_task(
                self._confirm_gone(turn, record, guard_done=guard_done)
            )

    def _release(self, turn: Turn) -> None:
        index = turn.slot.index
        turn.slot.release()
        with self._batch():
            self._apply(turn, Event.GONE)
            self._apply(turn, Event.RELEASED, index=index)
        if turn.guard is not None and turn.guard.returncode is not None:
            self._drop_guard_record(turn)
        self.grant_waiters()

    def _drop_guard_record(self, turn: Turn) -> None:
        """Once the work is confirmed gone and the guard reaped, its record serves nobody."""
        try:
            os.unlink(turn.guard.record_path)
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("unable to remove guard record %s: %s", turn.guard.record_path, e.strerror)

    def retry_unconfirmed(self) -> None:
        """Turns whose guard is done but whose work was not yet confirmed gone: look again."""
        for turn in list(self.turns.values()):
            if (
                turn.guard is not None
                and turn.guard.returncode is not None
                and turn.id not in self._confirming
            ):
                if turn.state in (State.EXITED, State.STOPPING):
                    record = self._read_guard_record(turn)
                    asyncio.get_running_loop().create_task(
                        self._confirm_gone(turn, record, guard_done=True)
                    )

    # -- restart ---------------------------------------------------------------------------------

    def restore(self, data: dict, slot_views: list) -> list[str]:
        """Take back what the last supervisor acknowledged (queue.json). Returns problems found.

        Call before serving requests; the caller grants waiters afterwards.
        """
        with self._batch():
            problems = self._restore(data, slot_views)
        self.save()
        return problems

    def _restore(self, data: dict, slot_views: list) -> list[str]:
        now = self.clock()
        problems: list[str] = []
        finished, skipped = store.load_finished(self.paths.finished)
        if skipped:
            problems.append(f"{self.paths.finished}: {skipped} unreadable lines skipped")
        for item_id, entry in data["finished"].items():  # written by an older build into queue.json
            try:
                finished.setdefault(item_id, (str(entry[0]), float(entry[1])))
            except (TypeError, ValueError, IndexError):
                problems.append(f"finished entry {item_id!r} is malformed")
        self.finished = {
            i: (state, at) for i, (state, at) in finished.items() if now - at < FINISHED_MEMORY
        }
        self._compact_finished()
        for entry in data["running"]:
            if (
                not isinstance(entry, dict)
                or not isinstance(entry.get("id"), str)
                or not isinstance(entry.get("key"), str)
            ):
                problems.append(f"running entry {str(entry)[:200]} is malformed")
            elif entry["id"] not in self.finished:
                self.lost_running.append({"id": entry["id"], "key": entry["key"]})
        self.settle_lost(slot_views)
        for entry in data["reservations"]:
            try:
                self._restore_reservation(entry, now)
            except (TypeError, KeyError, ValueError, ProtocolError) as e:
                problems.append(f"reservation entry {str(entry)[:200]} is malformed: {e}")
        for entry in data["waiting"]:
            try:
                self._restore_turn(entry)
            except (TypeError, KeyError, ValueError, ProtocolError) as e:
                problems.append(
                    f"waiting entry {str(entry.get('id') if isinstance(entry, dict) else entry)[:200]} "
                    f"is malformed: {e}"
                )
        return problems

    def _compact_finished(self) -> None:
        self._finished_appended = 0
        try:
            store.rewrite_finished(self.paths.finished, self.finished)
        except OSError as e:
            log.error("unable to rewrite %s: %s", self.paths.finished, e.strerror)

    def settle_lost(self, slot_views: list) -> None:
        """End the story of a dead supervisor's turns once no slot shows their work any more."""
        still_held = {
            v.turn for v in slot_views if v.state in ("orphaned", "unreadable", "held") and v.turn
        }
        lost, self.lost_running = self.lost_running, []
        with self._batch():
            for entry in lost:
                if entry["id"] in still_held:
                    self.lost_running.append(entry)
                    continue
                turn = Turn(
                    entry["id"], entry["key"], [], None, {}, HolderInfo(), state=State.RUNNING
                )
                turn.exit = {"code": None, "signal": None, "reason": "supervisor_restarted"}
                self._apply(turn, Event.EXITED, **turn.exit)
                self._apply(turn, Event.GONE)
                self._apply(turn, Event.RELEASED, index=None)

    def _restored_requester(self, holder: HolderInfo) -> procs.Identity | None | bool:
        """The requester's identity, None when none was given, False when it is gone."""
        if holder.pid is None:
            return None
        ident = procs.Identity(holder.pid, holder.start) if holder.start is not None else None
        return ident if ident is not None and procs.process_running(ident) else False

    def _restore_reservation(self, entry: dict, now: float) -> None:
        holder = parse_holder(entry["holder"])
        reservation = Reservation(
            str(entry["id"]),
            str(entry["key"]),
            holder,
            requested_at=float(entry["requested_at"]),
            state=State.QUEUED,
        )
        if entry.get("wait_deadline") is not None:
            self._deadlines[reservation.id] = float(entry["wait_deadline"])
        requester = self._restored_requester(holder)
        self.reservations[reservation.id] = reservation
        if reservation.holder_key:
            self._holders[reservation.holder_key] = reservation.id
        self._idle.clear()
        if entry.get("state") == State.GRANTED.value:
            reservation.state = State.GRANTED
            until = min(float(entry["until"]), now + self.settings.reservation_ttl)
            slot = None
            if requester is not False and until > now:
                slot = self.gate.try_acquire(
                    reservation.key,
                    Holder(self.me.pid, self.me.start, **holder.labels()),
                    reservation={"id": reservation.id, "until": until},
                )
            if slot is None:
                reason = (
                    "requester_gone"
                    if requester is False
                    else "expired"
                    if until <= now
                    else "lost"
                )
                self._apply(reservation, Event.RELEASED, reason=reason, index=None)
                return
            reservation.slot = slot
            reservation.until = until
            self._call_later(reservation.id, until - now, self._reservation_expired)
            if requester:
                self._watch_requester(requester, reservation)
        else:
            self._requeue(reservation, requester)

    def _restore_turn(self, entry: dict) -> None:
        args = protocol_turn_args(entry)
        turn = Turn(
            args.id,
            args.key,
            args.argv,
            args.cwd,
            args.env,
            args.holder,
            requested_at=float(entry["requested_at"]),
            reservation=args.reservation,
            state=State.QUEUED,
        )
        if entry.get("wait_deadline") is not None:
            self._deadlines[turn.id] = float(entry["wait_deadline"])
        self.turns[turn.id] = turn
        self._idle.clear()
        self._requeue(turn, self._restored_requester(args.holder))

    def _requeue(self, item: Turn | Reservation, requester: procs.Identity | None | bool) -> None:
        """A restored waiter back in the queue at its old place, unless its requester is gone."""
        self.queue.add(item.key, item.id, item.requested_at)
        if requester is False:
            self.cancel(item.id, reason="requester_gone")
            return
        self._wait_limit(item)
        if requester:
            self._watch_requester(requester, item)

    # -- periodic --------------------------------------------------------------------------------

    def tick(self) -> None:
        now = self.clock()
        for item_id, (_, at) in list(self.finished.items()):
            if now - at <= FINISHED_MEMORY:
                break  # kept in the order they ended: the rest are younger
            del self.finished[item_id]
        if self._finished_appended > 2 * len(self.finished) + 1000:
            self._compact_finished()
        if self.queue:
            self.grant_waiters()
        for turn in self.turns.values():
            if turn.guard is not None:
                turn.guard.terminate_if_pending()
        self.retry_unconfirmed()

    # -- views -----------------------------------------------------------------------------------

    def ps(self) -> dict:
        slots = [view.to_json() for view in self.gate.inspect_all()]
        waits = []
        for waiter in self.queue.all():
            item = self.turns.get(waiter.id) or self.reservations[waiter.id]
            waits.append(
                {
                    "id": waiter.id,
                    "key": waiter.key,
                    "position": self.queue.position(waiter.id),
                    "since": waiter.requested_at,
                    "holder": item.holder.to_json(),
                    "reservation": isinstance(item, Reservation),
                }
            )
        return {"slots": slots, "waits": waits}

    def status(self) -> dict:
        return {
            "pid": os.getpid(),
            "version": __version__,
            "state_dir": str(self.paths.root),
            "started_at": self.started_at,
            "config": self.settings.config_source,
            "turns": sum(1 for t in self.turns.values() if t.state is not State.QUEUED),
            "waits": len(self.queue),
            "reservations": sum(1 for r in self.reservations.values() if r.state is State.GRANTED),
            "stopping": self.stopping,
        }

    # -- stopping --------------------------------------------------------------------------------

    def begin_stop(self) -> None:
        """No new grants; every waiter cancelled, every reservation released, every turn stopped."""
        if self.stopping:
            return
        self.stopping = True
        for item_id in [w.id for w in self.queue.all()]:
            self.cancel(item_id, reason="shutdown")
        for item in list(self.reservations.values()) + list(self.turns.values()):
            if item.state in (State.GRANTED, State.RUNNING, State.EXITED, State.STOPPING):
                self.cancel(item.id, reason="shutdown")

    async def wait_idle(self) -> None:
        await self._idle.wait()

    def close(self) -> None:
        for ident in list(self._requesters):
            self._close_requester(ident)


def protocol_turn_args(entry: dict) -> TurnArgs:
    """A waiting turn from queue.json, checked as strictly as a new request."""
    from .protocol import parse_turn

    return parse_turn(
        {
            name: entry.get(name)
            for name in ("id", "key", "argv", "cwd", "env", "holder", "reservation")
        }
    )
