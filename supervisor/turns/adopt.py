"""Adoption: the turns a supervisor that died (a crash, the OOM killer) or handed over (`ccsup
restart`) left running, taken over by the next one, with no running work lost.

Design note. A guard started with `--adopt-within T` ([guard] adopt_within) keeps its turn's work
running and contained for up to T once the supervisor it watches is gone, writing the turn's logs
itself, and waits on its channel (guardd.channel). At start, before anything is served or granted
(supervisor.turns.restore), each `running` entry of queue.json is looked at:
- its slot must read orphaned (lock free, work alive) and name that turn; its guard (pid + start,
  from the slot record, or, when the slot names only the turn's cgroup because its supervisor
  died between the guard's start and writing it in, from the guard's own record naming the turn)
  must still be that very process, and its record (guardd.record) must name the same guard and
  turn, be of version 1, say `running`, and name a channel of version 1;
- the guard is asked over its channel to watch us from now on (our pidfd goes with the request),
  and only then is the slot's lock taken back (SlotGate.adopt: the record must still name that
  turn and guard; it then names us as holder). The slot read as orphaned the whole time: counted
  against the cap, never handed out, so nothing could take it in between;
- the turn is re-bound as running: replayed (queued, granted, started; not published again), its
  guard followed (supervisor.guards.handle.AdoptedGuardProcess: its logs and its exit), and
  `turn.<id>.adopted {"id", "key", "index", "guard", "gap_s", "started_at"}` published.
Then today's rules catch up: a requester that died meanwhile gets its turn stopped
(`requester_gone`); the runtime limit counts from the guard's own start (admission's deadline on
`adopted`), so a turn past it is stopped with reason `timeout`; queued turns wait behind the slots
held; pauses were restored first.

Output. The stdout/stderr events go on from the byte offset after the last one the old supervisor
published when it saved it (a hand-over saves `offsets` in the entry); after a crash, from the
first read that reached the log REPUBLISH_MARGIN before the guard saw its supervisor gone (the
log's index, supervisor.output.line_times): bytes may then be published twice, always at the same
offsets with the same contents, and a subscriber drops what it already has (offsets tile the log).

What is not adopted stays as before: its slot reads orphaned while its work lives and the reaper
ends it once the guard's own wait is over (supervisor.slots.record.awaits_adoption: a guard that
cannot be spoken to is never killed blindly; its own dead-man ends its work after adopt_within);
a guard whose record is of a newer version (a later release's) reads unreadable and is left while
it lives (supervisor.slots.record.newer_guard_alive); the turn's story ends as a lost one
(`supervisor_restarted`) once its slot is free. A release without adoption left only
this: its guards end their turns with their supervisor (tests/system/test_upgrade.py). Not adopted:
an entry of an older build (no channel: its guard ended its work with its supervisor), a record
that is corrupt, of a newer version or of another guard (pid reuse), a guard that does not answer
within CHANNEL_TIMEOUT, and cluster turns (started without adopt_within: a cluster lease dies
with its supervisor; docs/containment.md). A "tty" turn is adopted as any: its guard hands over a
master of the pty it holds (guardd.pty) as a pipe turn's stdin, so input and resizing work again.

State: nothing of its own. Run again (a supervisor killed while adopting): what it adopted watches
it and is waited for by the guard again; the next supervisor adopts it anew.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from guardd import channel, procs
from guardd.record import RecordError, live_guard_of_turn, read_json

from ..caps import MACHINE_KEY, SlotState
from ..errors import CcsupError
from ..guards.handle import STREAMS, AdoptedGuardProcess
from ..output import line_times
from ..slots.gate import SlotView
from ..wire.args import parse_holder, parse_key
from ..wire.protocol import ProtocolError, check_id
from .endings import What
from .requesters import GONE
from .states import Event, Turn

if TYPE_CHECKING:
    from guardd import procs

    from ..paths import StatePaths
    from .endings import Endings
    from .ledger import Ledger
    from .requesters import Requesters
    from .seams import Gate
    from .starting import Starter
    from .states import Item


class Manager(Protocol):
    """What adoption uses of supervisor.turns.manager.Manager (which owns an Adoption: a
    Protocol here, not an import back)."""

    paths: StatePaths
    gate: Gate
    me: procs.Identity
    ledger: Ledger
    endings: Endings
    starter: Starter
    requesters: Requesters

    def watch_requester(self, ident: procs.Identity, item: Item) -> None: ...


log = logging.getLogger("ccsup.adopt")

CHANNEL_TIMEOUT = 1.0  # seconds a guard's channel may take to answer (a stopped guard: not adopted)
ASK_BATCH = 64  # guards asked before their answers are read
REPUBLISH_MARGIN = 2.0  # seconds of output before the gap published again after a crash


@dataclass
class Adoption:
    """What adoption did at start (for `status` and the log); the guards that wait and were not
    adopted are counted from their records (supervisor.guards.waiting)."""

    adopted: int = 0
    not_adopted: int = 0


def adopt_running(
    manager: Manager, entries: list[dict[str, Any]], views: list[SlotView]
) -> tuple[list[dict[str, Any]], list[str], Adoption]:
    """Adopt what can be of a dead supervisor's running turns; returns the entries not adopted
    (their story ends as lost ones), the problems to publish, and what was done."""
    by_turn: dict[tuple[str, str | None], SlotView] = {}
    for view in views:
        if view.state is SlotState.ORPHANED and view.turn:
            by_turn[view.key, view.turn] = view
    left: list[dict[str, Any]] = []
    problems: list[str] = []
    done = Adoption()

    def not_adopted(entry: dict[str, Any], e: _NotAdopted) -> None:
        left.append(entry)
        if e.problem:
            done.not_adopted += 1
            problems.append(f"turn {entry['id']} was not adopted: {e.problem}")

    # In batches: every guard of a batch is asked before the first answer is read, so they can
    # answer while we read (measured at 500 guards and load 2: 0.73-0.93 s either way, most of
    # it the guards' own work: waking, answering, rewriting their records at the ack). A batch
    # bounds the descriptors open at once (a socket and a pidfd each).
    for first in range(0, len(entries), ASK_BATCH):
        asked: list[_Asked] = []
        for entry in entries[first : first + ASK_BATCH]:
            # a pool's turn holds a slot of its member (supervisor.turns.pools)
            found = by_turn.get((entry.get("member") or entry["key"], entry["id"]))
            if found is None:
                left.append(entry)  # its slot is free (its work is gone) or held: as before
                continue
            try:
                asked.append(_ask(entry, found, manager.paths.guards))
            except _NotAdopted as e:
                not_adopted(entry, e)
        for one in asked:
            try:
                _take(manager, one, by_turn.get((MACHINE_KEY, one.turn_id)))
            except _NotAdopted as e:
                not_adopted(one.entry, e)
            else:
                done.adopted += 1
    if done.adopted or done.not_adopted:
        log.info("adopted %d running turn(s); %d not", done.adopted, done.not_adopted)
    return left, problems, done


class _NotAdopted(Exception):
    """Why an entry is not adopted: a problem to say, or None (nothing to adopt)."""

    def __init__(self, problem: str | None):
        self.problem = problem


def _guard_of(view: SlotView, guards: Path, turn_id: str) -> tuple[procs.Identity, str, bool]:
    """The turn's guard and its record's path, and whether the slot record named them. A slot
    naming only the turn's cgroup (its supervisor died between the guard's start and writing it
    in; the guard runs CMD from its start): the guard is found by its own record naming the turn
    (guardd.record.live_guard_of_turn)."""
    work = (view.record or {}).get("work") or {}
    guard, path = work.get("guard"), work.get("record")
    if guard is None and path is None:
        found = live_guard_of_turn(guards, turn_id)
        if found is None:
            raise _NotAdopted(None)  # its guard had not started, or is gone: nothing to adopt
        return found[0], found[1], False
    if not isinstance(guard, dict) or not isinstance(path, str):
        raise _NotAdopted(f"its slot record names no guard ({guard!r})")
    try:
        return procs.Identity(int(guard["pid"]), int(guard["start"])), path, True
    except (KeyError, TypeError, ValueError):
        raise _NotAdopted(f"its slot record names no guard ({guard!r})") from None


def _waiting_record(ident: procs.Identity, path: str, turn_id: str) -> dict[str, Any]:
    """The guard's record, when it is one we may adopt (see the module's note)."""
    try:
        record = read_json(path)
    except (OSError, RecordError) as e:
        raise _NotAdopted(f"its guard record {path} cannot be read: {e}") from None
    if record.get("v") != 1 or record.get("guard") != ident.to_json():
        raise _NotAdopted(f"its guard record {path} is of another version or guard")
    if record.get("turn") != turn_id or record.get("state") != "running":
        raise _NotAdopted(None)
    link = record.get("channel")
    if not isinstance(link, dict):
        raise _NotAdopted(None)  # started without adopt_within (an older build, a cluster turn)
    if link.get("v") != channel.CHANNEL_VERSION or not isinstance(link.get("path"), str):
        raise _NotAdopted(
            f"its guard speaks channel version {link.get('v')!r}, not {channel.CHANNEL_VERSION}; "
            "it is left to finish (counted) and reaped once its work is gone"
        )
    return record


@dataclass
class _Asked:
    """A running entry whose guard was asked to be adopted, its answer not read yet."""

    entry: dict[str, Any]
    view: SlotView
    turn_id: str
    key: str
    member: str | None  # a pool's turn: the member whose slot it holds
    holder: Any
    argv: list[str]
    ident: procs.Identity
    record_path: str
    named: bool  # the slot record names the guard (else it is written there once adopted)
    record: dict[str, Any]
    pidfd: int
    adopting: channel.Adopting


def _ask(entry: dict[str, Any], view: SlotView, guards: Path) -> _Asked:
    """Check the entry, its guard and its record (see the module's note), and ask the guard."""
    try:
        turn_id, key = check_id(entry["id"]), parse_key(entry["key"])
        member = parse_key(entry["member"]) if entry.get("member") is not None else None
        holder = parse_holder(entry.get("holder") or {})
        argv = entry.get("argv") or []
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            raise ValueError("'argv' is not a list of strings")
    except (KeyError, TypeError, ValueError, ProtocolError) as e:
        raise _NotAdopted(f"its entry is malformed: {e}") from None
    ident, record_path, named = _guard_of(view, guards, turn_id)
    if not procs.process_running(ident):
        raise _NotAdopted(None)  # gone meanwhile: its slot frees as a lost turn's
    record = _waiting_record(ident, record_path, turn_id)
    try:
        pidfd = os.pidfd_open(ident.pid)
    except OSError:
        raise _NotAdopted(None) from None
    if procs.identity_of(ident.pid) != ident:  # reused between the look and the open
        os.close(pidfd)
        raise _NotAdopted(None)
    try:
        adopting = channel.Adopting(record["channel"]["path"])
    except OSError as e:
        os.close(pidfd)
        raise _NotAdopted(f"its guard did not answer on its channel: {e}") from None
    return _Asked(
        entry, view, turn_id, key, member, holder, argv, ident, record_path, named, record, pidfd,
        adopting,
    )  # fmt: skip


def _take(manager: Manager, asked: _Asked, machine: SlotView | None) -> None:
    """Read the guard's answer; once it watches us, take its slot back and re-bind the turn."""
    entry, view, record, pidfd, ident = (
        asked.entry,
        asked.view,
        asked.record,
        asked.pidfd,
        asked.ident,
    )
    turn_id, key, holder = asked.turn_id, asked.key, asked.holder
    slot_key = asked.member or key
    try:
        answer = asked.adopting.finish(CHANNEL_TIMEOUT)
    except (OSError, ValueError) as e:
        os.close(pidfd)
        raise _NotAdopted(f"its guard did not answer on its channel: {e}") from None
    if not answer.get("ok"):
        os.close(pidfd)
        raise _NotAdopted(f"its guard refused: {answer.get('error')}")
    stdin = _stdin_fd(answer)
    # The guard watches us now: its slot is taken back under its lock (see the module's note).
    me = holder.held_by(manager.me.pid, manager.me.start)
    try:
        slot = manager.gate.adopt(slot_key, view.index, me, turn_id, ident)  # type: ignore[attr-defined]
    except (OSError, CcsupError) as e:  # its record cannot be written (a full disk)
        log.error("turn %s: unable to take its slot back: %s", turn_id, e)
        slot = None
    if slot is None:
        os.close(pidfd)
        if stdin >= 0:
            os.close(stdin)
        # Ours to end now (it watches us), and its slot reads orphaned until its work is gone.
        procs.signal_process(ident, 15)
        raise _NotAdopted(
            f"its slot {slot_key}#{view.index} cannot be taken back; the turn is stopped"
        )
    if machine is not None:
        try:
            slot.machine = manager.gate.adopt(  # type: ignore[attr-defined]
                MACHINE_KEY, machine.index, me, turn_id, ident
            )
        except (OSError, CcsupError) as e:  # it stays orphaned, counted, while the work lives
            log.error("turn %s: unable to take its machine slot back: %s", turn_id, e)
    cwd = entry.get("cwd") if isinstance(entry.get("cwd"), str) else None
    cgroup = record.get("cgroup") if isinstance(record.get("cgroup"), str) else None
    if not asked.named:  # the slot names it now, as a start would have
        try:
            command = {"argv": asked.argv, "cwd": cwd}
            slot.record_work(ident, asked.record_path, [], cgroup, command=command)
        except (OSError, CcsupError) as e:  # it reads as before: a cgroup alone, still counted
            log.error("turn %s: unable to name its guard in its slot: %s", turn_id, e)
    waited = answer.get("waited_s")
    gap = float(waited) if isinstance(waited, int | float) else 0.0
    started_at = record.get("started_at")
    turn = Turn(
        turn_id,
        key,
        asked.argv,
        cwd,
        {},
        holder,
        requested_at=_number(entry.get("requested_at"), time.time()),
        timeout=_number(entry.get("timeout"), None),
        stdin=entry["stdin"] if entry.get("stdin") in ("null", "tty") else "pipe",
    )
    turn.slot = slot
    turn.member = asked.member
    turn.adopted_at = time.time()
    turn.adoption_gap = round(gap, 6)
    ledger = manager.ledger
    ledger.add(turn)
    for event in (Event.QUEUED, Event.GRANTED, Event.STARTED):
        ledger.apply(turn, event, replay=True)
    started = _number(started_at, turn.adopted_at)
    manager.endings.running(turn, cgroup, started_at=started)
    guard = AdoptedGuardProcess(
        turn_id,
        ident,
        manager.paths.guards,
        pidfd=pidfd,
        offsets=_offsets(manager, entry, turn_id, turn.adopted_at - gap),
        stdin=stdin,
    )
    ledger.emit(
        f"turn.{turn_id}.adopted",
        {
            **turn.fields(),
            **({} if asked.member is None else {"member": asked.member}),
            "index": slot.index,
            "guard": ident.to_json(),
            "gap_s": turn.adoption_gap,
            "started_at": started,
        },
    )
    try:
        manager.starter.follow_adopted(turn, guard)
    except OSError as e:
        turn.followed = False  # Endings.tick watches for its end instead
        log.error("unable to follow the adopted guard of turn %s: %s; stopping it", turn_id, e)
        manager.endings.happen(turn, What.CANCEL, reason=f"unable to follow its guard: {e}")
        return
    requester = manager.requesters.restored(holder)
    if requester is GONE:
        manager.endings.happen(turn, What.CANCEL, reason="requester_gone")
    elif isinstance(requester, procs.Identity):
        manager.watch_requester(requester, turn)


def _stdin_fd(answer: dict[str, Any]) -> int:
    """The turn's stdin, when the guard handed it over (a "pipe" turn's writer, a "tty" turn's
    pty master); -1 otherwise."""
    fd = answer.get("stdin_fd")
    return fd if isinstance(fd, int) and fd >= 0 else -1


def _number(value: object, default: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    return float(value)


def _offsets(manager: Manager, entry: dict[str, Any], turn_id: str, gone_at: float) -> dict:
    """Where each stream's events go on: the saved offsets of a hand-over, else a margin before
    the gap (see the module's note)."""
    saved = entry.get("offsets")
    log_dir = manager.paths.turn_dir(turn_id)
    offsets: dict[str, int] = {}
    for stream in STREAMS:
        try:
            size = os.stat(log_dir / f"{stream}.log").st_size
        except OSError:
            size = 0
        value = saved.get(stream) if isinstance(saved, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= size:
            offsets[stream] = value
        else:
            index = log_dir / f"{stream}.idx"
            offsets[stream] = line_times.offset_since(index, gone_at - REPUBLISH_MARGIN, size)
    return offsets
