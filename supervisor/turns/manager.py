"""The manager decides: requests come in here, and waiters are granted here, fairly.

Design note. The manager is honcho's manager: it takes requests (turn, reserve, cancel, send),
answers them, and grants the head of each key's queue when a slot is free. Everything else is a
collaborator with one job (ledger, starter, endings, requesters, finished; restore drives them
after a restart), made in the constructor, where a test replaces the outside world
(supervisor.turns.seams).

Grants: keys are taken oldest head first; for each, `Admission.refusal` may hold the head back
(reason and until when), then the gate is asked for a slot; a new request never jumps older
waiters of its key, and a slot freed wakes one waiter of its key (with a machine cap, possibly of
another key). Grants are saved before any guard starts: a crash in between leaves the turn in the
`running` list of queue.json, never back in the queue to be run a second time. Slots freed by
other processes are noticed by `tick`, a short periodic retry while anyone waits.

A grant pass is all or nothing per item, and a failing key touches no other: when the gate
raises for a key (a record that a full disk will not take), or passes over slot files it cannot
use (`unreadable`: a lock that is a symlink, a corrupt record), that key's head stays queued, its
waiters read `unreadable` in ps, one `supervisor.error` event (with `key`) and one log line say
why (again only when the error changes), and the pass goes on with the other keys; turns granted
earlier in the pass are started whatever happens later in it. A request is therefore answered
with what it became (queued), never with an internal error for a turn that was queued all the
same; `tick` retries the key until the gate works again. A grant is started only once it is
saved (see supervisor.turns.ledger on a full disk).

Reservations wait in the same queue as turns and hold a slot (state `reserved` in ps) until a turn
binds it, it expires, or it is cancelled. A holder (session + agent) has at most one per key.

Knows requests, the queue's heads and the gate's `try_acquire`; nothing of processes, records or
sockets.

Admission: the policy asked before each grant, "may this key's head be granted now?".

The manager asks `Admission.refusal(item, now)` for the head of each key's queue, oldest head
first, before it asks the slot gate; a Refusal holds that key back (its reason, and until when if
known: None means until something changes) and the manager goes on to the next key. A refused
head is asked again at the next grant round (every slot freed, every request, and `tick`).
The default admits everything: the cap (the slot gate) is then the only limit. Pauses, start-rate
windows and other policies implement this protocol; nothing else in the grant path changes.

Knows nothing: a policy gets the waiting item and the time, and answers.

Wiring in one direction: the manager makes its admission (`admission=`, a function given the
manager as `Turns`: the ledger, the settings, `grant_waiters` and `cancel`) at the end of its own
construction, so a policy that follows the ledger's events and asks for grants or cancels at run
time has all of it when it is made, and nothing is set on either side afterwards. The wait queue's
order (`ordering=`, supervisor.turns.fairness) is the ledger's to apply.

Size: past 600 lines and still one concept, the decisions on requests and grants; each
collaborator named above is a module of its own, and what stays here is the order they are asked
in.
"""

from __future__ import annotations

import errno
import heapq
import logging
import os
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from guardd import procs

from ..errors import CcsupError, os_failure
from ..filework import FileWorker
from ..guards import containment
from ..guards import handle as spawn
from ..paths import StatePaths
from ..wire.args import ReserveArgs, SendArgs, TurnArgs
from ..wire.protocol import ProtocolError
from . import pools, rerun, store
from .adopt import Adoption
from .endings import Endings, What
from .fairness import Ordering
from .finished import FinishedIds
from .gone import Probe
from .ledger import Ledger, Publish
from .requesters import Requesters
from .seams import Gate, LoopTimers, StartGuard, Timers
from .starting import Starter
from .states import Event, Item, Reservation, State, Turn
from .waits import Queue


@dataclass(frozen=True)
class Refusal:
    """Why a key's head may not be granted now, and until when (None: until something changes)."""

    reason: str
    until: float | None = None
    detail: str = ""  # what ps says, when the policy's own words do not (a pool's members)


class Admission(Protocol):
    def refusal(self, item: Item, now: float, key: str | None = None) -> Refusal | None:
        """`key`: the key the item would be granted on when it is not its own (a pool's member)."""
        ...


class Turns(Protocol):
    """What an admission asks of the turn logic, the manager being one: the ledger (its events as
    they are emitted, its items, its file worker), the settings (a key's `[env]`), and two
    commands at run time."""

    ledger: Ledger
    settings: Settings

    def grant_waiters(self) -> None: ...
    def cancel(self, item_id: str, reason: str = "cancelled") -> dict[str, Any]: ...


class AdmitAll:
    def refusal(self, item: Item, now: float, key: str | None = None) -> Refusal | None:
        return None


def always_room(key: str, now: float) -> bool:
    """The default quota room: every key has it."""
    return True


log = logging.getLogger("ccsup.manager")


class _GateFailed(Exception):
    """The slot gate raised for a key (its lock or record cannot be used): nothing was taken."""

    def __init__(self, error: OSError | CcsupError):
        self.error = error


# Bytes a turn's stdin may hold that its pipe has not taken: a `send` past it is refused `busy`
# (nothing of it taken), so a turn that does not read costs the supervisor at most this much.
# Above `ccsup run`'s own hold-back (1 MiB + a 64 KiB chunk) and a whole 1 MiB frame.
STDIN_MAX_PENDING = 4 << 20
RETRY_INTERVAL = 0.25  # how often waiters retry slots that other processes may have freed
HELD_DETAIL = (
    "granted before its supervisor died, its guard not started: held until its requester asks "
    "for it again"
)


@dataclass
class Settings:
    grace: float
    scan: float
    bus_in: str | None
    config_source: str
    reservation_ttl: float = 60.0
    adopt_within: float = 0.0  # [guard] adopt_within: how long a guard waits to be adopted
    # [pools]: name -> members, in the order written (supervisor.turns.pools)
    pools: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # [env."<key>"]: what a key's turns get after the caller's env (supervisor.turns.starting)
    key_env: Mapping[str, Mapping[str, str]] = field(default_factory=dict)


class Manager:
    def __init__(
        self,
        *,
        paths: StatePaths,
        gate: Gate,
        publish: Publish,
        settings: Settings,
        clock: Callable[[], float] = time.time,
        start_guard: StartGuard = spawn.start_guard,
        timers: Timers | None = None,
        requesters: Callable[[Callable[[str], None]], Requesters] = Requesters,
        probe: Probe | None = None,
        admission: Callable[[Turns], Admission] | None = None,
        ordering: Ordering | None = None,
        me: procs.Identity | None = None,
        cgroups: containment.Cgroups | None = None,
        quota_room: Callable[[str, float], bool] = always_room,
    ):
        self.paths = paths
        self.gate = gate
        self.settings = settings
        self.clock = clock
        self.quota_room = quota_room  # may a key be granted now for its provider windows
        self.refused: dict[str, Refusal] = {}  # key -> why its head was last held back
        self.gate_errors: dict[str, str] = {}  # key -> the gate's last error for it, said once
        self.unsaved_grants: list[Turn] = []  # granted, not started until their grant is saved
        self.stopping = False
        self.draining = False  # `stop --drain`: no new turns, no grants; running ones go on
        self.handing_over = False  # `ccsup restart`: no new turns, no grants; the turns run on
        self.started_at = clock()
        me = me or procs.identity_of(os.getpid())
        if me is None:
            raise CcsupError(f"unable to read the start time of this process ({os.getpid()})")
        self.me: procs.Identity = me
        files = FileWorker()  # fsyncs and removals off the event loop
        self.finished = FinishedIds(paths.finished, clock, files)
        self.ledger = Ledger(
            files=files,
            queue_path=paths.queue,
            publish=publish,
            finished=self.finished,
            timers=timers or LoopTimers(),
            clock=clock,
            ordering=ordering,
        )
        self.endings = Endings(
            self.ledger,
            settings=lambda: self.settings,
            on_capacity=self.grant_waiters,
            probe=probe or Probe(paths.guards),
        )
        self.starter = Starter(
            self.ledger,
            paths=paths,
            start_guard=start_guard,
            settings=lambda: self.settings,
            happen=self.endings.happen,
            on_running=self.endings.running,
            cgroups=cgroups,
        )
        self.requesters = requesters(
            partial(self.endings.happen_to, what=What.CANCEL, reason="requester_gone")
        )
        self.ledger.on_finished.append(
            lambda item: self.requesters.unwatch(item.requester, item.id)
        )
        self.ledger.on_flushed.append(self.start_saved_grants)
        self.queue: Queue = self.ledger.queue
        self.turns = self.ledger.turns
        self.reservations = self.ledger.reservations
        self.adoption = Adoption()  # what restore's adoption did (supervisor.turns.adopt)
        # Last: the admission is given the manager whole (see the module's note on wiring).
        self.admission: Admission = AdmitAll() if admission is None else admission(self)

    # -- requests --------------------------------------------------------------------------------

    def request_turn(self, args: TurnArgs) -> dict[str, Any]:
        turn_id = args.id or uuid.uuid4().hex
        again = self.turns.get(turn_id)
        if again is not None and again.held_until is not None and again.key == args.key:
            rerun.take_again(self, again, args)  # its requester asks again (supervisor.turns.rerun)
            self.grant_waiters()
            return self._answer(again)
        known = self._known(turn_id, args.key)
        if known is not None:
            return known
        if self.closed_to_new:
            raise ProtocolError("stopping", "the supervisor is stopping and takes no new turns")
        if args.cwd is not None and not os.path.isdir(args.cwd):
            raise ProtocolError("bad_request", f"'cwd' {args.cwd[:200]!r} is not a directory")
        reservation = self.reservations.get(args.reservation) if args.reservation else None
        if reservation is not None:
            self._check_binding(reservation, args)
        requester = self.requesters.identify(args.holder)
        held = reservation is not None and reservation.state is State.GRANTED
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
            timeout=args.timeout,
            env_replace=args.env_replace,
            stdin=args.stdin,
            winsize=args.winsize,
        )
        if reservation is not None and not held:  # still waiting: the turn takes its place
            turn.requested_at = reservation.requested_at
        if held:
            self._save_request(turn, ("running", turn.running_entry()))
        else:
            self._save_request(turn, ("waiting", turn.to_json(self._deadline_of(turn))))
        self.ledger.add(turn)
        if reservation is not None and held:
            self._bind_held(turn, reservation)
        else:
            with self.ledger.batch():
                if reservation is not None:
                    self.queue.replace(reservation.id, turn.id)
                    self.ledger.apply(reservation, Event.CANCELLED, reason="bound", turn=turn.id)
                else:
                    self.queue.add(turn.key, turn_id, turn.requested_at)
                self.wait_limit(turn)  # before the save, so queue.json has the deadline
                self.ledger.apply(
                    turn,
                    Event.QUEUED,
                    position=self.queue.position(turn_id),
                    holder=turn.holder.to_json(),
                    argv=turn.argv,
                    cwd=turn.cwd,
                )
        if requester is not None:
            self.watch_requester(requester, turn)
        self.grant_waiters()
        if turn.state is State.QUEUED:
            self.starter.prepare(turn)
        return self._answer(turn)

    def _deadline_of(self, item: Item) -> float | None:
        """The wait deadline `wait_limit` will set for a new item (queue.json keeps it)."""
        if item.wait_timeout is None:
            return None
        return item.requested_at + item.wait_timeout

    def _save_request(self, item: Item, entry: store.Entry) -> None:
        """A new request's entry on file before anything of it is changed or published: else it is
        refused (`no_space` on a full disk), and nothing of it is queued, answered or announced."""
        try:
            self.ledger.save_first(item.id, entry)
        except OSError as e:
            what = "reservation" if isinstance(item, Reservation) else "turn"
            where = e.filename or self.ledger.queue_path
            message = f"unable to save {what} {item.id} in {where}: {e.strerror}; it was not queued"
            log.error("%s", message)
            code = "no_space" if e.errno in (errno.ENOSPC, errno.EDQUOT) else "failed"
            raise ProtocolError(code, message) from None

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
        assert slot is not None
        self.ledger.cancel_timer(reservation.id)
        slot.bind(turn=turn.id, reservation=None)
        turn.slot = slot
        with self.ledger.batch():
            self.ledger.apply(
                turn,
                Event.QUEUED,
                position=None,
                holder=turn.holder.to_json(),
                argv=turn.argv,
                cwd=turn.cwd,
            )
            self.ledger.apply(
                reservation, Event.RELEASED, reason="bound", turn=turn.id, index=slot.index
            )
            self.ledger.apply(turn, Event.GRANTED, index=slot.index, reservation=reservation.id)
        self.starter.start(turn)

    def wait_limit(self, item: Item) -> None:
        """A waiter with a deadline is cancelled (reason timeout) when it is still waiting then."""
        if item.wait_timeout is not None:
            self.ledger.deadlines.setdefault(item.id, item.requested_at + item.wait_timeout)
        deadline = self.ledger.deadlines.get(item.id)
        if deadline is not None:
            timed_out = partial(self.endings.happen_to, what=What.WAIT_TIMEOUT, reason="timeout")
            self.ledger.call_later(item.id, deadline - self.clock(), timed_out)

    def _answer(self, turn: Turn) -> dict[str, Any]:
        return {"id": turn.id, "state": turn.state.value, "position": self.queue.position(turn.id)}

    def _known(self, item_id: str, key: str) -> dict[str, Any] | None:
        """A request with an id already seen is answered, never run twice."""
        item = self.ledger.get(item_id)
        if item is not None:
            if item.key != key or isinstance(item, Reservation):
                raise ProtocolError("conflict", f"id {item_id} is already used for another request")
            return self._answer(item)
        if item_id in self.finished:
            return {"id": item_id, "state": self.finished.state_of(item_id), "position": None}
        return None

    def reject(self, item_id: str, reason: str) -> None:
        """A bad request that came on the bus: its answer is a rejected event."""
        if self.ledger.get(item_id) is not None or item_id in self.finished:
            return  # a garbled retry of a known id changes nothing
        self.ledger.emit(f"turn.{item_id}.rejected", {"id": item_id, "reason": reason})

    def reserve(self, args: ReserveArgs) -> dict[str, Any]:
        if args.key in self.settings.pools:
            raise ProtocolError(
                "bad_request",
                f"'key' {args.key!r} is a pool ([pools]): a reservation names one of its "
                f"members ({', '.join(self.settings.pools[args.key])})",
            )
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
                "state": self.finished.state_of(res_id),
                "until": None,
                "position": None,
            }
        reservation = Reservation(
            res_id, args.key, args.holder, requested_at=self.clock(), wait_timeout=args.wait_timeout
        )
        holder_key = reservation.holder_key
        same_holder = self.ledger.holders.get(holder_key) if holder_key else None
        if same_holder is not None:  # one per holder and key; asking again never extends it
            return self._reservation_answer(self.reservations[same_holder])
        if self.closed_to_new:
            raise ProtocolError(
                "stopping", "the supervisor is stopping and takes no new reservations"
            )
        requester = self.requesters.identify(args.holder)
        self._save_request(
            reservation, ("reservations", reservation.to_json(self._deadline_of(reservation)))
        )
        self.ledger.add(reservation)
        self.queue.add(reservation.key, reservation.id, reservation.requested_at)
        self.wait_limit(reservation)  # before the save, so queue.json has the deadline
        self.ledger.apply(
            reservation,
            Event.QUEUED,
            position=self.queue.position(reservation.id),
            holder=reservation.holder.to_json(),
        )
        if requester is not None:
            self.watch_requester(requester, reservation)
        self.grant_waiters()
        return self._reservation_answer(reservation)

    def _reservation_answer(self, reservation: Reservation) -> dict[str, Any]:
        state = {State.GRANTED: "held"}.get(reservation.state, reservation.state.value)
        return {
            "reservation": reservation.id,
            "key": reservation.key,
            "state": state,
            "until": reservation.until,
            "position": self.queue.position(reservation.id),
        }

    def cancel(self, item_id: str, reason: str = "cancelled") -> dict[str, Any]:
        item = self.ledger.get(item_id)
        if item is None:
            if item_id in self.finished:
                # Nothing to do: said so (`finished`), so `ccsup cancel` does not claim it acted.
                return {"id": item_id, "state": self.finished.state_of(item_id), "finished": True}
            raise ProtocolError("not_found", f"no turn or reservation {item_id}")
        if item in self.unsaved_grants:  # never started: it ends here, its slot freed
            self.unsaved_grants.remove(item)
            why = f"{reason} before its grant could be saved"
            self.endings.happen(item, What.START_FAILED, reason=why)
        else:
            self.endings.happen(item, What.CANCEL, reason=reason)
        return {"id": item_id, "state": item.state.value}

    def send(self, args: SendArgs) -> dict[str, Any]:
        turn = self.turns.get(args.id)
        if turn is None:
            raise ProtocolError("not_found", f"no turn {args.id}")
        if turn.stdin == "null" and (args.data or args.eof):
            raise ProtocolError("failed", f"turn {args.id} has no stdin to write to (stdin: null)")
        if args.winsize is not None:
            self._resize(turn, args.winsize)
        if turn.stdin == "tty" and args.eof:
            # a terminal has no end of input to close: ^D is what ends a line discipline's input
            args = SendArgs(args.id, args.data + b"\x04", False, args.winsize)
        if turn.state is State.GRANTED and turn.guard is None:  # its guard is being started
            if turn.early_eof:
                raise ProtocolError("failed", f"the stdin of turn {args.id} is closed")
            _check_room(args.id, len(turn.early_stdin), len(args.data))
            turn.early_stdin += args.data
            turn.early_eof = args.eof
            return {"id": args.id, "written": len(args.data), "pending": len(turn.early_stdin)}
        # Granted with its guard attached: CMD starts or runs (`started` waits for the guard's
        # record), and the guard's stdin takes the bytes for it as at the hand-over above.
        if turn.guard is None or turn.state not in (State.GRANTED, State.RUNNING):
            raise ProtocolError(
                "failed", f"turn {args.id} is {turn.state.value}, not running: nothing to write to"
            )
        _check_room(args.id, turn.guard.stdin_pending, len(args.data))
        try:
            written = turn.guard.write_stdin(args.data, args.eof)
        except OSError as e:
            raise ProtocolError(
                "failed", f"unable to write to the stdin of turn {args.id}: {e}"
            ) from None
        # `pending`: what the turn's pipe has not taken yet, so a writer can hold back
        return {"id": args.id, "written": written, "pending": turn.guard.stdin_pending}

    def _resize(self, turn: Turn, winsize: tuple[int, int]) -> None:
        """A "tty" turn's terminal gets this size: now, or at its start if it has not started."""
        if turn.stdin != "tty":
            raise ProtocolError(
                "bad_request", f"turn {turn.id} has no terminal to resize (stdin: {turn.stdin})"
            )
        turn.winsize = winsize
        if turn.guard is not None and turn.state in (State.GRANTED, State.RUNNING):
            try:
                turn.guard.resize(*winsize)
            except OSError as e:
                raise ProtocolError(
                    "failed", f"unable to resize the terminal of turn {turn.id}: {e}"
                ) from None

    def on_guard_hint(self, topic: str, body: dict[str, Any]) -> None:
        parts = topic.split(".")
        if len(parts) == 3:
            self.endings.on_hint(parts[1], parts[2])

    # -- requesters ------------------------------------------------------------------------------

    def watch_requester(self, ident: procs.Identity, item: Item) -> None:
        if self.requesters.watch(ident, item.id):
            item.requester = ident
        else:
            self.cancel(item.id, reason="requester_gone")

    # -- grants ----------------------------------------------------------------------------------

    def grant_waiters(self) -> None:
        """Grant the head of every key's queue while slots are free, oldest head first.

        All or nothing per item, and per key: a gate that fails for one key (a lock that cannot
        be opened, a record that cannot be written) leaves that key's head waiting, reported as
        `unreadable` and by one `supervisor.error` event, and the pass goes on with the other
        keys; what was granted before it in the pass is started all the same.
        """
        if self.closed_to_new:
            return
        granted: list[Turn] = []
        try:
            with self.ledger.batch():
                self._grant_heads(granted)
        finally:
            self.unsaved_grants += granted
            self.start_saved_grants()

    def start_saved_grants(self) -> None:
        """Start the granted turns once their grants are saved: a crash then cannot run them twice
        (a grant not on file would leave the turn `waiting` there, to run again after a restart).
        While queue.json cannot be written they wait, granted, holding their slots."""
        if not self.unsaved_grants or self.ledger.in_batch or self.ledger.save_error is not None:
            return  # (in a batch: its save comes at its end, which calls this again)
        starting, self.unsaved_grants = self.unsaved_grants, []
        for turn in starting:
            if turn.state is State.GRANTED and turn.guard is None:
                self.starter.start(turn)

    def _grant_heads(self, granted: list[Turn]) -> None:
        """The heads of all keys, oldest first across keys (request time, then id): a key's head
        is tried while it is the oldest head left; a key whose head is refused is done for this
        pass. So a pool's waiter and a member's direct waiter compete for the member's slot in
        the order they asked (supervisor.turns.pools), and a slot of the machine cap goes to the
        oldest waiter of any key."""
        heads: list[tuple[float, str, str]] = []
        for key in self.queue.keys_by_age():
            self._push_head(heads, key)
        while heads:
            _, _, key = heapq.heappop(heads)
            if self._grant_head(key, granted):
                self._push_head(heads, key)

    def _push_head(self, heads: list[tuple[float, str, str]], key: str) -> None:
        head = self.queue.head(key)
        if head is not None:
            item = self.ledger.get(head)
            assert item is not None, head
            heapq.heappush(heads, (item.requested_at, item.id, key))

    def _grant_head(self, key: str, granted: list[Turn]) -> bool:
        """Grant the head of `key` (on a member, for a pool); False when it must wait."""
        head = self.queue.head(key)
        item = self.ledger.get(head) if head is not None else None
        assert item is not None, head
        now = self.clock()
        if isinstance(item, Turn) and item.held_until is not None:  # supervisor.turns.rerun
            self.refused[key] = Refusal("requester", item.held_until, HELD_DETAIL)
            return False
        refusal = self.admission.refusal(item, now)
        if refusal is not None:
            self.refused[key] = refusal  # what ps can say of the key's waiters
            return False
        members = self.settings.pools.get(key)
        if members is not None and isinstance(item, Turn):
            taken = self._grant_on_member(key, item, members, now)
        else:
            taken = self._grant_on(key, item, key)
        if taken and isinstance(item, Turn):
            granted.append(item)
        return taken

    def _grant_on_member(self, pool: str, turn: Turn, members: tuple[str, ...], now: float) -> bool:
        """The pool's head on its first member (in the order written) that admits it, has quota
        room and a free slot; else the pool's refusal says why (supervisor.turns.pools)."""
        refusals: list[Refusal] = []
        for member in members:
            refusal = self.admission.refusal(turn, now, key=member)
            if refusal is None and not self.quota_room(member, now):
                refusal = Refusal("quota")
            if refusal is None and self._grant_on(member, turn, pool):
                self.refused.pop(pool, None)
                return True
            refusals.append(refusal or self.refused.get(member) or Refusal("key_full"))
        self.refused[pool] = Refusal(*pools.why_pool_waits(members, refusals))
        return False

    def _grant_on(self, key: str, item: Item, queue_key: str) -> bool:
        """Take a slot of `key` for the head of `queue_key`'s queue (a pool's, or its own):
        False, with the key's refusal noted, when the gate has none free or fails."""
        try:
            taken = self._grant(item, key)
        except _GateFailed as failed:
            self._gate_failed(key, failed.error)
            return False
        if not taken:
            # the gate's word ("key_full", "machine_full", ...) for why the key waits
            word = getattr(self.gate, "last_refusal", None) or "key_full"
            self.refused[key] = Refusal(word)
            if word == "unreadable":
                self._unreadable(key)
            else:
                self.gate_errors.pop(key, None)
            return False
        self.gate_errors.pop(key, None)
        if key == queue_key:
            self.refused.pop(key, None)
        return True

    def _unreadable(self, key: str) -> None:
        """The gate passed over slot files of key it cannot use (a lock that is a symlink, a
        corrupt record): said once, with what the gate's view says of them, until it changes."""
        if key in self.gate_errors:
            return
        inspect = getattr(self.gate, "inspect", None)
        views = inspect(key) if inspect is not None else []
        errors = [v.error for v in views if v.state == "unreadable" and v.error]
        message = "; ".join(errors) or f"a slot file of key {key} cannot be used"
        self.gate_errors[key] = message
        log.error("%s: key %s waits until it is repaired", message, key)
        self.ledger.emit("supervisor.error", {"message": message, "key": key})

    def _gate_failed(self, key: str, error: OSError | CcsupError) -> None:
        """The gate failed for key: its head waits (`unreadable`), said once per distinct error."""
        if isinstance(error, CcsupError):
            message = error.message
        else:
            message = os_failure("take a slot of key", key, error).message
            if error.filename is not None:
                message = f"{message} ({error.filename})"
        self.refused[key] = Refusal("unreadable")
        if self.gate_errors.get(key) == message:
            return  # retried at every tick: one log line and one event, not four a second
        self.gate_errors[key] = message
        log.error("%s: key %s waits until it is repaired", message, key)
        self.ledger.emit("supervisor.error", {"message": message, "key": key})

    def _grant(self, item: Item, key: str) -> bool:
        """Take a slot of `key` (the item's own, or its pool's member) for the head of its queue
        (False when none is free); publish the grant."""
        holder = item.holder.held_by(self.me.pid, self.me.start)
        until = self.clock() + self.settings.reservation_ttl
        try:  # the gate undoes its own half-taken slot when it raises: nothing is held then
            if isinstance(item, Reservation):
                reservation = {"id": item.id, "until": until}
                slot = self.gate.try_acquire(key, holder, reservation=reservation)
            else:
                slot = self.gate.try_acquire(key, holder, turn=item.id)
        except (OSError, CcsupError) as e:
            raise _GateFailed(e) from e
        if slot is None:
            return False
        self.queue.remove(item.id)
        self.ledger.cancel_timer(item.id)
        self.ledger.deadlines.pop(item.id, None)
        item.slot = slot
        if slot.took_over is not None:
            self.ledger.emit(f"slot.{slot.key}.reaped", {"key": slot.key, "index": slot.index})
        if isinstance(item, Reservation):
            self.hold(item, until)
        elif key != item.key:  # a pool's turn, on this member
            item.member = key
            self.ledger.apply(item, Event.GRANTED, index=slot.index, member=key)
        else:
            self.ledger.apply(item, Event.GRANTED, index=slot.index)
        return True

    def hold(self, reservation: Reservation, until: float, *, replay: bool = False) -> None:
        """The reservation holds its slot until `until` (replay: restored, already announced)."""
        assert reservation.slot is not None
        slot = reservation.slot
        log.info(
            "reservation %s holds %s#%d until %.3f", reservation.id, slot.key, slot.index, until
        )
        reservation.until = until
        self.ledger.apply(
            reservation, Event.GRANTED, replay=replay, index=reservation.slot.index, until=until
        )
        expired = partial(self.endings.happen_to, what=What.EXPIRED, reason="expired")
        self.ledger.call_later(reservation.id, until - self.clock(), expired)

    # -- periodic, views, stopping ---------------------------------------------------------------

    def tick(self) -> None:
        """The periodic duties, in order (the daemon runs each on its own: supervisor.daemon.main)."""
        for _, duty in self.periodic_duties():
            duty()

    def periodic_duties(self) -> list[tuple[str, Callable[[], None]]]:
        """(name, duty) of what `tick` does: forget old finished ids, retry grants, look again at
        ends. Each may raise; a caller that runs them on a timer isolates each from the others."""
        return [
            ("expire_finished", self.finished.expire),
            ("save_state", self.ledger.save_again),
            ("grant", self.retry_grants),
            ("confirm_ends", self.endings.tick),
        ]

    def retry_grants(self) -> None:
        """Slots freed by other processes (or a repaired key) are seen here: waiters try again;
        grants that are saved by now (`save_state` ran before) are started."""
        self.start_saved_grants()
        if self.queue:
            self.grant_waiters()

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

    @property
    def closed_to_new(self) -> bool:
        """Stopping, draining or handing over: no new turn or reservation, no grant."""
        return self.stopping or self.draining or self.handing_over

    # -- a hand-over (`ccsup restart`) -------------------------------------------------------------

    def begin_hand_over(self) -> None:
        """No new turn, reservation or grant from now on; nothing that runs is touched."""
        self.handing_over = True

    def starting_count(self) -> int:
        """Granted turns whose guard is being started (asked of the zygote, not answered yet,
        or started and not yet running CMD on record: supervisor.turns.starting)."""
        unsaved = {t.id for t in self.unsaved_grants}
        return sum(
            1 for t in self.turns.values() if t.state is State.GRANTED and t.id not in unsaved
        )

    def hand_over(self) -> int:
        """Let go of every running turn's guard, untouched, and save queue.json whole: each turn
        with a guard stays in `running`, with the byte offsets of its output published so far
        (`offsets`), so the supervisor that adopts it goes on from there. Nothing is published
        or changed for a turn after this; returns how many turns were let go of."""
        let_go = 0
        for turn in self.turns.values():
            if turn.guard is not None:
                turn.offsets = turn.guard.hand_over()
                let_go += 1
        self.ledger.save_all()
        return let_go

    def running_count(self) -> int:
        """Turns and reservations that hold (or are taking) a slot: what a drain waits for."""
        busy = (State.GRANTED, State.RUNNING, State.EXITED, State.STOPPING)
        items = list(self.reservations.values()) + list(self.turns.values())
        return sum(1 for item in items if item.state in busy)

    async def wait_idle(self) -> None:
        await self.ledger.idle.wait()

    def close(self) -> None:
        self.requesters.close()
        self.ledger.files.stop()


def _check_room(turn_id: str, pending: int, size: int) -> None:
    """`busy` when `size` more bytes would put the turn's unread stdin past STDIN_MAX_PENDING."""
    if size and pending + size > STDIN_MAX_PENDING:
        raise ProtocolError(
            "busy",
            f"the stdin of turn {turn_id} holds {pending} bytes its command has not read yet "
            f"(at most {STDIN_MAX_PENDING}): {size} more were not taken; send them again once "
            "`pending` (an empty send answers it) is lower",
        )
