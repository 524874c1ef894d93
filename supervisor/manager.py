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

State: in memory; the turns' slots and guards have records on disk (slots, guardd) from which a
restarted supervisor reaps what this one left. Finished ids are remembered for ten minutes so a
retried request is answered, not run again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable

from guardd import procs
from guardd.record import RecordError, read_json

from . import __version__, reaper, spawn
from .paths import StatePaths
from .protocol import ProtocolError, SendArgs, TurnArgs
from .slots import Holder, SlotGate
from .turns import Event, State, Turn
from .waits import WaitQueue

log = logging.getLogger("ccsup.manager")

FINISHED_MEMORY = 600.0  # seconds a finished id is remembered
RETRY_INTERVAL = 0.25  # how often waiters retry slots that other processes may have freed


@dataclass
class Settings:
    grace: float
    scan: float
    bus_in: str | None
    config_source: str


def work_groups(record: dict) -> list[procs.Group]:
    """The own group and every recorded group of a guard record."""
    groups = []
    own = record.get("own_group")
    if isinstance(own, dict) and own.get("pgid"):
        groups.append(procs.Group.from_json(own))
    for entry in record.get("groups") or ():
        groups.append(procs.Group.from_json(entry))
    return groups


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
        self.finished: dict[str, tuple[str, float]] = {}
        self.queue = WaitQueue()
        self.stopping = False
        self.started_at = clock()
        self.me = procs.identity_of(os.getpid())
        self._requesters: dict[procs.Identity, tuple[int, set[str]]] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._confirming: set[str] = set()
        self._idle = asyncio.Event()
        self._idle.set()

    # -- events ----------------------------------------------------------------------------------

    def _apply(self, turn: Turn, event: Event, **fields) -> None:
        turn.advance(event)
        self.publish(f"turn.{turn.id}.{event.value}", {**turn.fields(), **fields})
        if turn.state.terminal:
            self._finish(turn)

    def _finish(self, turn: Turn) -> None:
        self.turns.pop(turn.id, None)
        self.queue.remove(turn.id)
        timer = self._timers.pop(turn.id, None)
        if timer is not None:
            timer.cancel()
        self._unwatch_requester(turn)
        self.finished[turn.id] = (turn.state.value, self.clock())
        if not self.turns:
            self._idle.set()

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
        position = self.queue.add(turn.key, turn_id, turn.requested_at)
        self._apply(turn, Event.QUEUED, position=position, holder=turn.holder.to_json())
        if requester is not None:
            self._watch_requester(requester, turn)
        if args.wait_timeout is not None:
            loop = asyncio.get_running_loop()
            self._timers[turn_id] = loop.call_later(args.wait_timeout, self._wait_timed_out, turn_id)
        self.grant_waiters()
        return self._answer(turn)

    def _answer(self, turn: Turn) -> dict:
        return {"id": turn.id, "state": turn.state.value, "position": self.queue.position(turn.id)}

    def _known(self, turn_id: str, key: str) -> dict | None:
        """A request with an id already seen is answered, never run twice."""
        turn = self.turns.get(turn_id)
        if turn is not None:
            if turn.key != key:
                raise ProtocolError("conflict", f"turn id {turn_id} is already used for key {turn.key}")
            return self._answer(turn)
        if turn_id in self.finished:
            return {"id": turn_id, "state": self.finished[turn_id][0], "position": None}
        return None

    def reject(self, turn_id: str, reason: str) -> None:
        """A bad request that came on the bus: its answer is a rejected event."""
        if turn_id in self.turns or turn_id in self.finished:
            return  # a garbled retry of a known id changes nothing
        self.publish(f"turn.{turn_id}.rejected", {"id": turn_id, "reason": reason})

    def cancel(self, turn_id: str, reason: str = "cancelled") -> dict:
        turn = self.turns.get(turn_id)
        if turn is None:
            if turn_id in self.finished:
                return {"id": turn_id, "state": self.finished[turn_id][0]}
            raise ProtocolError("not_found", f"no turn {turn_id}")
        if turn.state is State.QUEUED:
            self.queue.remove(turn_id)
            self._apply(turn, Event.CANCELLED, reason=reason)
        elif turn.state is State.RUNNING:
            turn.stop_reason = reason
            self._apply(turn, Event.STOPPING, reason=reason)
            turn.guard.terminate()
        elif turn.state in (State.EXITED, State.STOPPING):
            turn.guard.terminate()  # already ending; asking again costs nothing
        return {"id": turn_id, "state": turn.state.value}

    def send(self, args: SendArgs) -> dict:
        turn = self.turns.get(args.id)
        if turn is None:
            raise ProtocolError("not_found", f"no turn {args.id}")
        if turn.guard is None or turn.state is not State.RUNNING:
            raise ProtocolError("failed", f"turn {args.id} is {turn.state.value}, not running: nothing to write to")
        try:
            written = turn.guard.write_stdin(args.data, args.eof)
        except OSError as e:
            raise ProtocolError("failed", f"unable to write to the stdin of turn {args.id}: {e}") from None
        return {"id": args.id, "written": written}

    def _wait_timed_out(self, turn_id: str) -> None:
        self._timers.pop(turn_id, None)
        turn = self.turns.get(turn_id)
        if turn is not None and turn.state is State.QUEUED:
            self.cancel(turn_id, reason="timeout")

    # -- requesters ------------------------------------------------------------------------------

    def _requester_identity(self, holder) -> procs.Identity | None:
        if holder.pid is None:
            return None
        start = holder.start if holder.start is not None else procs.start_ticks(holder.pid)
        ident = procs.Identity(holder.pid, start) if start is not None else None
        if ident is None or not procs.process_running(ident):
            raise ProtocolError("bad_request", f"the requester (pid {holder.pid}) is not running")
        return ident

    def _watch_requester(self, ident: procs.Identity, turn: Turn) -> None:
        entry = self._requesters.get(ident)
        if entry is None:
            try:
                pidfd = os.pidfd_open(ident.pid)
            except ProcessLookupError:
                self.cancel(turn.id, reason="requester_gone")
                return
            if not procs.process_running(ident):
                os.close(pidfd)
                self.cancel(turn.id, reason="requester_gone")
                return
            entry = (pidfd, set())
            self._requesters[ident] = entry
            asyncio.get_running_loop().add_reader(pidfd, self._requester_gone, ident)
        entry[1].add(turn.id)
        turn.requester = ident

    def _unwatch_requester(self, turn: Turn) -> None:
        ident = turn.requester
        entry = self._requesters.get(ident) if ident else None
        if entry is None:
            return
        entry[1].discard(turn.id)
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
        for turn_id in sorted(entry[1]):
            self.cancel(turn_id, reason="requester_gone")
        if ident in self._requesters:
            self._close_requester(ident)

    # -- grants ----------------------------------------------------------------------------------

    def grant_waiters(self) -> None:
        """Grant the head of every key's queue while slots are free, oldest head first."""
        if self.stopping:
            return
        for key in self.queue.keys_by_age():
            while (head := self.queue.head(key)) is not None:
                turn = self.turns[head]
                holder = Holder(self.me.pid, self.me.start, **turn.holder.labels())
                slot = self.gate.try_acquire(key, holder, turn=turn.id)
                if slot is None:
                    break
                self.queue.remove(head)
                self._start(turn, slot)

    def _start(self, turn: Turn, slot) -> None:
        turn.slot = slot
        self._apply(turn, Event.GRANTED, index=slot.index)
        if slot.took_over is not None:
            self.publish(f"slot.{slot.key}.reaped", {"key": slot.key, "index": slot.index})
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
            turn.exit = {"code": None, "signal": None, "reason": f"unable to start the guard: {e.strerror or e}"}
            self._apply(turn, Event.EXITED, **turn.exit)
            self._release(turn)
            return
        turn.guard = guard
        loop = asyncio.get_running_loop()
        guard.attach(
            loop,
            self.paths.turn_dir(turn.id),
            on_output=partial(self._on_output, turn),
            on_exit=partial(self._on_guard_exit, turn),
        )
        slot.record_work(guard.identity, str(guard.record_path), [])
        self._apply(turn, Event.STARTED, guard=guard.identity.to_json())

    def _on_output(self, turn: Turn, stream: str, offset: int, data: bytes) -> None:
        self.publish(
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
        record = self._read_guard_record(turn)
        if record is None:
            return
        kind = parts[2]
        if kind == "group":
            self._publish_new_groups(turn, record)
        elif kind == "exited":
            if exit_from_record(record) is not None:
                self._learn_exit(turn, record, None)
        elif kind == "gone" and record.get("state") == "gone":
            asyncio.get_running_loop().create_task(self._confirm_gone(turn, record, guard_done=False))

    def _publish_new_groups(self, turn: Turn, record: dict) -> None:
        groups = work_groups(record)
        for group in groups:
            if group not in turn.groups_seen:
                turn.groups_seen.add(group)
                self.publish(f"turn.{turn.id}.group", {"id": turn.id, **group.to_json()})
        turn.slot.record_work(turn.guard.identity, str(turn.guard.record_path), groups)

    async def _confirm_gone(self, turn: Turn, record: dict | None, *, guard_done: bool) -> None:
        """Check the work is gone (ending it if the guard could not), then release the slot."""
        if turn.id in self._confirming:
            return
        self._confirming.add(turn.id)
        try:
            groups = work_groups(record) if record else []
            if guard_done:
                alive = any(procs.group_alive(g) for g in groups) or bool(
                    procs.processes_with_env("CCSUP_TURN", turn.id)
                )
                if alive:
                    log.warning("turn %s: the guard ended but its work did not; ending it now", turn.id)
                    ended = await asyncio.to_thread(
                        reaper.end_work, groups, turn=turn.id, grace=self.settings.grace
                    )
                    if not ended:
                        log.error("turn %s: work still alive; the slot stays held and is retried", turn.id)
                        return
            elif any(procs.group_alive(g) for g in groups):
                return  # a hint that does not hold: the groups still run
            if turn.state.terminal or turn.state is State.GONE:
                return
            self._learn_exit(turn, record, None if not guard_done else turn.guard.returncode)
            if turn.exit is None:
                return  # the pidfd path will bring the outcome
            self._release(turn)
        finally:
            self._confirming.discard(turn.id)

    def _release(self, turn: Turn) -> None:
        self._apply(turn, Event.GONE)
        index = turn.slot.index
        turn.slot.release()
        self._apply(turn, Event.RELEASED, index=index)
        self.grant_waiters()

    def retry_unconfirmed(self) -> None:
        """Turns whose guard is done but whose work was not yet confirmed gone: look again."""
        for turn in list(self.turns.values()):
            if turn.guard is not None and turn.guard.returncode is not None and turn.id not in self._confirming:
                if turn.state in (State.EXITED, State.STOPPING):
                    record = self._read_guard_record(turn)
                    asyncio.get_running_loop().create_task(self._confirm_gone(turn, record, guard_done=True))

    # -- periodic --------------------------------------------------------------------------------

    def tick(self) -> None:
        now = self.clock()
        for turn_id, (_, at) in list(self.finished.items()):
            if now - at > FINISHED_MEMORY:
                del self.finished[turn_id]
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
            turn = self.turns[waiter.id]
            waits.append(
                {
                    "id": waiter.id,
                    "key": waiter.key,
                    "position": self.queue.position(waiter.id),
                    "since": waiter.requested_at,
                    "holder": turn.holder.to_json(),
                }
            )
        return {"slots": slots, "waits": waits}

    def status(self) -> dict:
        running = sum(1 for t in self.turns.values() if t.state is not State.QUEUED)
        return {
            "pid": os.getpid(),
            "version": __version__,
            "state_dir": str(self.paths.root),
            "started_at": self.started_at,
            "config": self.settings.config_source,
            "turns": running,
            "waits": len(self.queue),
            "stopping": self.stopping,
        }

    # -- stopping --------------------------------------------------------------------------------

    def begin_stop(self) -> None:
        """No new grants; every waiter cancelled; every running turn stopped."""
        if self.stopping:
            return
        self.stopping = True
        for turn_id in [w.id for w in self.queue.all()]:
            self.cancel(turn_id, reason="shutdown")
        for turn in list(self.turns.values()):
            if turn.state in (State.RUNNING, State.EXITED, State.STOPPING):
                self.cancel(turn.id, reason="shutdown")

    async def wait_idle(self) -> None:
        await self._idle.wait()

    def close(self) -> None:
        for ident in list(self._requesters):
            self._close_requester(ident)
