"""Rerun: a turn granted by a supervisor that died before the turn's guard started, held at its
key's head after the restart until its requester asks for it again by the same id.

Design note. A turn's env (it may hold API keys) and its stdin are never on file once it leaves the
wait, so the supervisor that restarts cannot run such a turn by itself: only its requester (a
riding `ccsup run`, Client.run_turn, which still have argv, env and stdin) can. So at restore,
before anything is granted, each `running` entry of queue.json that was not adopted is looked at
(`held_ones`); it is held when it provably never ran its command:
- its slot does not read held, orphaned or unreadable with its work, and names no guard
  (`work.guard` is written only once a guard runs);
- no guard record names the turn, except one that says its command was not run (state `gone`,
  no own group, reason `parent_gone`: the guard saw its supervisor gone before exec, guardd.child);
- no live process is of the turn: none has the turn's id as an argument (a forked guard's title
  `ccsup-guard <turn>`, a direct guard's `--turn <turn>`) or the marker CCSUP_TURN=<turn> (its
  command). After a supervisor is dead no command of its turns can exec any more (the last look
  before exec is at the supervisor's pidfd, guardd.child), and one that passed that look before
  is the child of a guard that is alive; so nothing of such a turn ever ran, or ever will.
A held turn goes back in its key's queue at its old place (request time, then id: it is normally
the head) in phase `awaiting` (supervisor.turns.endings): the grant pass refuses it (reason
`requester`, with until when), so its key's other waiters stay behind it, as they did behind its
grant. Its requester, once a supervisor answers again, sees it held in `ps` (`held_until`) and
sends its turn request again by the same id (supervisor.client.ride_through): `take_again` gives
the held turn that request's env, stdin and cwd (its key and argv must be the same: else
`conflict`), and it is granted, started and followed as any turn (a second `granted`, this
supervisor's). Its logs are emptied when it is held (a guard that saw its supervisor gone said so
there), so the requester gets the command's output whole. Without a living requester (its pid
gone at restore or later, watched as any requester), or when none asks again within
`adopt_within` + ASK_AGAIN_MARGIN (the window its requester rides through in), it ends as a lost
turn did: `exited` (`supervisor_restarted`, with a `detail` that says why), `gone`, `released`.
Not held, and ended as lost ones as before: `tty` turns (their terminal was the old
supervisor's), and any turn of which something may have run.

State: the held turn's queue.json entry stays its `running` entry (no env: none is on file) until
it is asked again; then it is a waiting turn like any other (its env in `secrets/`) until it is
granted. Runs again / restart: a supervisor killed while it holds one, or before the grant of a
turn asked again, leaves the same `running` entry, and the next supervisor holds it again (its
window counts from that restart). Half-way: holding writes nothing but the turn's emptied logs
(truncated in place; a crash meanwhile leaves them empty or as they were, and they are emptied
again). Old, corrupt or newer state: an entry that does not parse as a request is ended as a
lost one; a guard record that cannot be read, or is of an unknown version, may be a guard that ran,
so its turn is not held.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from guardd import procs
from guardd.record import SCOPE_ENV, TURN_ENV, RecordError, read_json, record_dir_scope

from ..caps import SlotState
from ..client.ride_through import RETURN_MARGIN
from ..slots.gate import SlotView
from ..wire.args import TurnArgs, parse_holder, parse_key
from ..wire.protocol import ProtocolError, check_id
from .endings import What
from .requesters import GONE
from .states import Event, Turn

if TYPE_CHECKING:
    from ..paths import StatePaths
    from .endings import Endings
    from .ledger import Ledger
    from .requesters import Requesters
    from .starting import Starter
    from .states import Item
    from .waits import Queue


class Settings(Protocol):
    adopt_within: float


class Manager(Protocol):
    """What rerun uses of supervisor.turns.manager.Manager (which calls it: a Protocol here,
    not an import back)."""

    paths: StatePaths
    clock: Callable[[], float]
    ledger: Ledger
    queue: Queue
    endings: Endings
    requesters: Requesters
    starter: Starter

    @property
    def settings(self) -> Settings: ...

    def watch_requester(self, ident: procs.Identity, item: Item) -> None: ...


log = logging.getLogger("ccsup.rerun")

# Seconds past adopt_within a held turn waits for its requester: the margin its requester waits
# for a supervisor to answer again (supervisor.client.ride_through), so each waits as long.
ASK_AGAIN_MARGIN = RETURN_MARGIN
TITLE = "ccsup-guard "  # a forked guard's title: `ccsup-guard <turn>` (guardd.zygote)
WORK_SEEN = (SlotState.HELD, SlotState.ORPHANED, SlotState.UNREADABLE)


def held_ones(
    manager: Manager, entries: list[dict[str, Any]], views: list[SlotView]
) -> list[dict[str, Any]]:
    """The entries (of turns a dead supervisor left running, not adopted) that never ran their
    command (see the module's note); the others are left to end as lost ones."""
    candidates: dict[str, dict[str, Any]] = {}
    for entry in entries:
        try:  # an entry of an older build (no argv) cannot be asked for again: ended as lost
            check_id(entry["id"])
            _argv(entry.get("argv"))
            float(entry["requested_at"])
        except (KeyError, TypeError, ValueError, ProtocolError):
            continue
        if entry.get("stdin") != "tty":
            candidates[entry["id"]] = entry
    for view in views:
        if view.turn in candidates:
            work = (view.record or {}).get("work") or {}
            if view.state in WORK_SEEN or work.get("guard") is not None:
                del candidates[view.turn]
    if candidates:
        for turn_id in _guards_recorded(manager.paths.guards, set(candidates)):
            del candidates[turn_id]
    if candidates:
        scope = record_dir_scope(str(manager.paths.guards))
        for turn_id in _alive(set(candidates), scope):
            del candidates[turn_id]
    return list(candidates.values())


def _guards_recorded(guards: os.PathLike[str], ids: set[str]) -> set[str]:
    """The turns among `ids` that a guard record names, unless it says CMD was not run; a record
    that cannot be read counts for every turn (it may be one of theirs)."""
    try:
        names = [n for n in os.listdir(guards) if n.endswith(".json")]
    except FileNotFoundError:
        return set()
    except OSError:
        return set(ids)
    found: set[str] = set()
    for name in names:
        try:
            record = read_json(os.path.join(os.fspath(guards), name))
        except (OSError, RecordError):
            return set(ids)
        turn = record.get("turn")
        if turn in ids and not _not_run(record):
            found.add(turn)
    return found


def _not_run(record: dict[str, Any]) -> bool:
    """A guard record that says its command never ran: it saw its supervisor gone before exec."""
    return (
        record.get("v") == 1
        and record.get("state") == "gone"
        and record.get("own_group") is None
        and record.get("reason") == "parent_gone"
    )


def _alive(ids: set[str], scope: str | None) -> set[str]:
    """The turns among `ids` of which a live process is: a guard (its id an argument of its
    command line) or a command (CCSUP_TURN=<id>, of this state directory's scope). One pass."""
    found: set[str] = set()
    markers = {f"{TURN_ENV}={turn_id}".encode(): turn_id for turn_id in ids}
    scoped = f"{SCOPE_ENV}={scope}".encode() if scope is not None else None
    me = os.getpid()
    for pid in procs.all_pids():
        if pid == me:
            continue
        args = _read(f"/proc/{pid}/cmdline")
        for arg in args.split(b"\0") if args else ():
            text = arg.decode(errors="replace")
            turn_id = text[len(TITLE) :] if text.startswith(TITLE) else text
            if turn_id in ids:
                found.add(turn_id)
        env = _read(f"/proc/{pid}/environ")
        if env:
            entries = set(env.split(b"\0"))
            if scoped is None or scoped in entries:
                found.update(markers[m] for m in entries & markers.keys())
    return found


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def hold(manager: Manager, entry: dict[str, Any]) -> str | None:
    """Hold a turn that never ran (see `held_ones`) at its key's head for its requester; its
    problem when the entry does not parse (it then ends as a lost one: the caller's)."""
    try:
        turn = Turn(
            check_id(entry["id"]),
            parse_key(entry["key"]),
            _argv(entry.get("argv")),
            entry.get("cwd") if isinstance(entry.get("cwd"), str) else None,
            {},
            parse_holder(entry.get("holder") or {}),
            requested_at=float(entry["requested_at"]),
            timeout=_seconds(entry.get("timeout")),
            stdin="null" if entry.get("stdin") == "null" else "pipe",
        )
    except (KeyError, TypeError, ValueError, ProtocolError) as e:
        return f"turn {entry.get('id')!r} cannot be held for its requester: {e}"
    window = manager.settings.adopt_within + ASK_AGAIN_MARGIN
    turn.held_until = manager.clock() + window
    ledger = manager.ledger
    ledger.add(turn)
    manager.queue.add(turn.key, turn.id, turn.requested_at)
    ledger.apply(turn, Event.QUEUED, replay=True)
    _empty_logs(manager, turn.id)
    log.info("turn %s: granted, never started; held %g s for its requester", turn.id, window)
    requester = manager.requesters.restored(turn.holder)
    if requester is GONE:
        manager.endings.happen(turn, What.CANCEL, reason="requester_gone")
        return None
    not_asked = partial(manager.endings.happen_to, what=What.CANCEL, reason="not_asked_again")
    ledger.call_later(turn.id, window, not_asked)
    if isinstance(requester, procs.Identity):
        manager.watch_requester(requester, turn)
    return None


def take_again(manager: Manager, turn: Turn, args: TurnArgs) -> None:
    """The held turn's requester asked again: the turn takes that request's env, stdin and cwd
    and waits (at its old place: the head) to be granted as any waiter. `conflict` when the
    request is not the same turn's (another command, or a terminal)."""
    if args.argv != turn.argv or args.stdin == "tty":
        raise ProtocolError(
            "conflict",
            f"id {turn.id} is held for its requester's own command ({' '.join(turn.argv)[:200]!r})",
        )
    if args.cwd is not None and not os.path.isdir(args.cwd):
        raise ProtocolError("bad_request", f"'cwd' {args.cwd[:200]!r} is not a directory")
    turn.env, turn.env_replace = args.env, args.env_replace
    turn.stdin, turn.cwd, turn.timeout = args.stdin, args.cwd, args.timeout
    turn.held_until = None
    manager.ledger.cancel_timer(turn.id)
    manager.ledger.changed(turn.id)  # a waiting entry now (its env in secrets/) until granted
    log.info("turn %s: asked again by its requester", turn.id)
    manager.starter.prepare(turn)


def _empty_logs(manager: Manager, turn_id: str) -> None:
    """A held turn's logs emptied: nothing of its command is in them, and what its guard said
    there (`the supervisor is gone: CMD was not run`) is no output of the command's."""
    directory = manager.paths.turn_dir(turn_id)
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if name.endswith((".log", ".idx")):
            try:
                os.truncate(directory / name, 0)
            except OSError as e:
                log.warning("unable to empty %s: %s", directory / name, e.strerror)


def _argv(value: object) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(a, str) for a in value):
        raise ValueError("'argv' is not a non-empty list of strings")
    return value


def _seconds(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"'timeout' {value!r} is not a number")
    return float(value)
