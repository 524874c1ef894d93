"""The slot gate: a machine-wide cap per key, held as flock slots, with orphans found and reaped.

Knows flock, slot records, caps and group liveness (from guardd); nothing of ZeroMQ or asyncio.
Nothing here blocks on another holder: every lock is taken with LOCK_NB. Only `reap` blocks (it
waits for work to end), and the supervisor runs it in a thread.

Design note. A slot of key K is `<state>/slots/K/slot-<i>.lock` plus `slot-<i>.json`. Holding an
exclusive flock on the lock file *is* holding the slot: the kernel drops it when the holder dies,
even by SIGKILL, and keeps it for a stopped holder, so no liveness guess is ever needed for the
holder itself. Lock files are never deleted (unlinking a held lock file would let a second holder
lock a new file at the same path); after locking, the holder checks that the file it locked is
still the one at the path. The record says who holds the slot and what work runs under it; it is
written atomically (temp file, fsync, rename) only by whoever holds the lock. The lock is the
truth about holding; the record is the truth about work. When the lock is free but the record is
not released, the recorded work decides: alive (guard process by identity, or any recorded group,
including those in the guard's own record) means *orphaned*: counted against the cap, never handed
out, until a reaper takes the lock, ends the work, confirms it gone and marks the record released.
Gone or absent means free: the next holder takes it over and says so (`Slot.took_over`).

Rejected alternatives: pid files and liveness polling (pid reuse, and a stopped holder looks dead
to nobody but is slow to judge); a probe that takes a lock to read state (a racer that tries the
slot during the probe sees it busy and may be refused): readers use /proc/locks instead, by the
lock file's device and inode, parsed once per call.

The cap: try_acquire tries indices below the cap; each index is one lock, so holders below the cap
can never exceed it. After a lowered cap, holders above it may remain: every slot file present is
then counted (held, reserved, orphaned and unreadable all count), before any lock is touched and
again after one is taken, so no grant happens until the count is under the cap. With a machine cap,
the `_machine` key is a slot key of its own, locked before the key's slot and unlocked again when
the key is full; the two records are written only once both locks are held.

The state question:
- Runs again / restarts: nothing is loaded; every call reads the files afresh. A restarted
  supervisor sees its old slots as orphaned (work alive) or free (work gone) and reaps the former.
- Stops half-way: killed after locking and before writing, the lock dies with it and the old record
  (released, or unreleased with dead work) reads as free. Killed after writing, the record says
  unreleased: free at once when it had no work, orphaned while recorded work lives. A crash inside
  a write leaves at most a stray `.slot-<i>.json.<pid>.tmp`, which nothing reads.
- Old, empty, corrupt or newer-version records, a directory that cannot be read, or a guard record
  named by the work that cannot be read: *unreadable*. Counted as taken, never handed out, shown
  with an error naming the file. Nothing here deletes or rewrites them; a person fixes or removes
  the file (a reaper does act on a slot whose own record is readable but whose guard record is not:
  it ends what it knows of and releases).
- No record yet, or a missing directory: free; directories are created (0700) on first acquire.

Limits: a fork without exec shares the lock (flock belongs to the open file description), so a
holder must not fork children that outlive it without exec; lock fds are O_CLOEXEC. Escapees known
only by their `CCSUP_TURN` marker are ended by the reaper but do not make a slot orphaned (finding
them means reading every process's environment, too slow for every acquire).
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from guardd import procs
from guardd.procs import Group, Identity, available_memory, file_key, held_locks
from guardd.record import RecordError, read_json, record_groups, write_json

from .caps import MACHINE_KEY, Caps, check_key, key_problem
from .containment import cgroup_populated, remove_cgroup
from .errors import CcsupError, UsageError, os_failure
from .holder import Holder
from .reaper import end_work

SLOT_VERSION = 1
FREE, RESERVED, HELD, ORPHANED, UNREADABLE = "free", "reserved", "held", "orphaned", "unreadable"
TAKEN = (RESERVED, HELD, ORPHANED, UNREADABLE)
_LOCK_RETRIES = 3  # a lock file replaced under us this many times in a row: treat the slot as busy


@dataclass
class SlotView:
    """One slot as a reader sees it, without taking anything."""

    key: str
    index: int
    cap: int
    state: str
    turn: str | None = None
    holder: dict | None = None
    pid: int | None = None  # the guard's
    groups: list[dict] = field(default_factory=list)
    since: float | None = None
    error: str | None = None
    record: dict | None = None

    def to_json(self) -> dict:
        data = {
            "key": self.key,
            "index": self.index,
            "cap": self.cap,
            "state": self.state,
            "turn": self.turn,
            "holder": self.holder,
            "pid": self.pid,
            "groups": self.groups,
            "since": self.since,
        }
        if self.error is not None:
            data["error"] = self.error
        return data


# ---- records -------------------------------------------------------------------------------


def _bad_record(path, why: str) -> RecordError:
    return RecordError(f"{path} is not a usable slot record: {why}")


def _work_parts(work: dict, path) -> tuple[Identity | None, str | None, list[Group]]:
    """The guard, the guard's record path and the groups of a record's `work` (RecordError if malformed)."""
    try:
        guard = None if work.get("guard") is None else Identity.from_json(work["guard"])
        record = work.get("record")
        if record is not None and not isinstance(record, str):
            raise TypeError("record is not a path")
        groups = [Group.from_json(g) for g in work.get("groups") or []]
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise _bad_record(path, f"malformed 'work' ({e})") from None
    return guard, record, groups


def read_slot_record(path: str | Path) -> dict | None:
    """The slot record at path, None when there is none; RecordError when it cannot be used."""
    try:
        data = read_json(path, SLOT_VERSION)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        raise RecordError(f"unable to read {path}: its directory is not a directory") from None
    if not isinstance(data.get("released"), bool):
        raise _bad_record(path, "'released' is not true or false")
    holder = data.get("holder")
    if holder is not None and not isinstance(holder, dict):
        raise _bad_record(path, "'holder' is not an object")
    work = data.get("work")
    if work is not None:
        if not isinstance(work, dict):
            raise _bad_record(path, "'work' is not an object")
        _work_parts(work, path)
    return data


def work_groups(work: dict, path="slot record") -> tuple[Identity | None, list[Group]]:
    """Every group a record's work names: its own list plus the guard record's own group and groups.

    RecordError when the guard record exists but cannot be read (its groups are unknown).
    """
    guard, record, groups = _work_parts(work, path)
    if record:
        try:
            data = read_json(record)
        except FileNotFoundError:
            data = None
        if data is not None:
            try:
                groups.extend(record_groups(data))
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise RecordError(
                    f"{record} is not a usable guard record: malformed groups ({e})"
                ) from None
    unique = list(dict.fromkeys(groups))
    return guard, unique


def work_alive(work: dict, path="slot record") -> bool:
    """Is anything of this recorded work still running? RecordError when that cannot be known."""
    guard, groups = work_groups(work, path)
    if guard is not None and procs.process_running(guard):
        return True
    cgroup = work.get("cgroup")
    if isinstance(cgroup, str) and cgroup and cgroup_populated(cgroup):
        return True  # the kernel's word: something of the turn runs in its cgroup
    return bool(procs.live_groups(groups))  # one pass over /proc, whatever the number of groups


# ---- locks ---------------------------------------------------------------------------------


def _try_lock(path: str) -> int | None:
    """Lock the slot file at path without blocking: the fd, or None when someone else holds it."""
    for _ in range(_LOCK_RETRIES):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except OSError:
            os.close(fd)
            raise
        mine = os.fstat(fd)
        try:
            there = os.stat(path)
        except FileNotFoundError:
            there = None
        if there is not None and (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino):
            return fd
        os.close(fd)  # the file at the path was replaced or removed: what we locked is no slot
    return None


# ---- the gate ------------------------------------------------------------------------------


class _Full(Exception):
    """No slot for this key now; reason is "full" or "unreadable"."""

    def __init__(self, reason: str):
        self.reason = reason


class Slot:
    """A held slot: owns the flock fd in this process until release()."""

    def __init__(self, key, index, cap, fd, path, record, took_over, clock, machine=None):
        self.key: str = key
        self.index: int = index
        self.cap: int = cap
        self.took_over: dict | None = took_over
        self.record: dict = record
        self.machine: Slot | None = machine  # the `_machine` slot taken with this one
        self._fd: int | None = fd
        self._path: str = path
        self._clock = clock

    @property
    def released(self) -> bool:
        return self._fd is None

    def _write(self) -> None:
        self.record["updated_at"] = self._clock()
        try:
            write_json(self._path, self.record, 0o600)
        except OSError as e:
            raise os_failure("write slot record", self._path, e) from None

    def _check_held(self, what: str) -> None:
        if self._fd is None:
            raise CcsupError(f"unable to {what} slot {self.key}#{self.index}: it was released")

    def bind(self, *, turn: str | None, reservation: dict | None) -> None:
        """Say which turn and reservation this slot is for (the record is rewritten)."""
        self._check_held("bind")
        self.record["turn"] = turn
        self.record["reservation"] = _reservation(reservation)
        self._write()
        if self.machine is not None:
            self.machine.bind(turn=turn, reservation=reservation)

    def record_work(
        self, guard: Identity, record_path: str, groups: list[Group], cgroup: str | None = None
    ) -> None:
        """Record the work running under this slot: a dead holder's slot then stays taken while it lives."""
        self._check_held("record work in")
        self.record["work"] = {
            "guard": guard.to_json(),
            "record": None if record_path is None else str(record_path),
            "groups": [g.to_json() for g in groups],
        }
        if cgroup is not None:
            self.record["work"]["cgroup"] = cgroup  # the turn's cgroup: the reaper ends it by that
        self._write()
        if self.machine is not None:
            self.machine.record_work(guard, record_path, groups, cgroup)

    def release(self) -> None:
        """Mark the record released, then unlock (the machine slot too). Idempotent.

        Call it only when the work is confirmed gone. If the write fails the lock is still dropped:
        the unreleased record then reads as orphaned while its work lives, which is the truth.
        """
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            self.record["released"] = True
            self._write()
        finally:
            os.close(fd)
            if self.machine is not None:
                self.machine.release()

    def __repr__(self) -> str:
        state = "released" if self._fd is None else "held"
        return f"<Slot {self.key}#{self.index} cap={self.cap} {state}>"


def _reservation(reservation: dict | None) -> dict | None:
    if reservation is None:
        return None
    try:
        return {"id": str(reservation["id"]), "until": float(reservation["until"])}
    except (KeyError, TypeError, ValueError):
        raise UsageError(
            f"bad reservation {reservation!r}: give {{'id': ..., 'until': epoch seconds}}"
        ) from None


class SlotGate:
    """The machine-wide gate over `<state_dir>/slots`. See the module's design note."""

    def __init__(
        self,
        state_dir: Path,
        caps: Caps,
        *,
        clock: Callable[[], float] = time.time,
        available_memory: Callable[[], int] = available_memory,
    ):
        # Plain strings, not Path: path joining showed up as a third of an acquire's cost.
        self.root = os.path.join(os.fspath(state_dir), "slots")
        self.caps = caps  # the supervisor replaces it on reload
        self.clock = clock
        self.available_memory = available_memory
        self.last_refusal: str | None = None
        self.reap_failures: list[SlotView] = []

    # -- paths

    def _dir(self, key: str) -> str:
        return f"{self.root}/{key}"

    def _cap(self, key: str) -> int:
        if key == MACHINE_KEY:
            # A leftover `_machine` directory without a machine cap: cap 0, so only taken slots show.
            return self.caps.machine_cap or 0
        return self.caps.cap_for(key)

    # -- acquiring

    def try_acquire(
        self, key: str, holder: Holder, *, turn: str | None = None, reservation: dict | None = None
    ) -> Slot | None:
        """Take a slot of key now, or None. Never blocks on a holder.

        On None, self.last_refusal says why: "low_memory" (below min_free_memory; nothing was
        touched), "machine_full", "key_full", or "unreadable" (the slots that filled the machine or
        the key include an unreadable one, or the key's directory cannot be read: a person must look).
        With a machine cap, the `_machine` slot is locked first and unlocked again if the key is full.
        A bad key raises UsageError.
        """
        check_key(key)
        reservation = _reservation(reservation)
        caps = self.caps
        self.last_refusal = None
        if caps.min_free_memory is not None and self.available_memory() < caps.min_free_memory:
            self.last_refusal = "low_memory"
            return None
        machine = None
        if caps.machine_cap is not None:
            try:
                machine = self._claim(MACHINE_KEY, caps.machine_cap)
            except _Full as full:
                self.last_refusal = "unreadable" if full.reason == UNREADABLE else "machine_full"
                return None
        try:
            claim = self._claim(key, caps.cap_for(key))
        except _Full as full:
            if machine is not None:
                os.close(machine[1])  # nothing written yet: the old machine record stands
            self.last_refusal = "unreadable" if full.reason == UNREADABLE else "key_full"
            return None
        except BaseException:
            if machine is not None:
                os.close(machine[1])
            raise
        machine_slot = None
        try:
            if machine is not None:
                machine_slot = self._make_slot(
                    MACHINE_KEY, caps.machine_cap, machine, holder, turn, reservation
                )
            return self._make_slot(
                key, caps.cap_for(key), claim, holder, turn, reservation, machine_slot
            )
        except BaseException:
            os.close(claim[1])
            if machine_slot is not None:
                machine_slot.release()
            elif machine is not None:
                os.close(machine[1])
            raise

    def _make_slot(self, key, cap, claim, holder, turn, reservation, machine=None) -> Slot:
        index, fd, took_over = claim
        record = {
            "v": SLOT_VERSION,
            "key": key,
            "index": index,
            "cap": cap,
            "holder": holder.to_json(),
            "turn": turn,
            "reservation": reservation,
            "work": None,
            "released": False,
            "updated_at": None,
        }
        slot = Slot(
            key,
            index,
            cap,
            fd,
            f"{self._dir(key)}/slot-{index}.json",
            record,
            took_over,
            self.clock,
            machine,
        )
        slot._write()
        return slot

    def _claim(self, key: str, cap: int) -> tuple[int, int, dict | None]:
        """Lock a free slot of key: (index, fd, the old unreleased record taken over or None)."""
        directory = self._dir(key)
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            names = []
        except OSError:
            raise _Full(UNREADABLE) from None
        higher = [i for i in _indices(names) if i >= cap]
        unreadable = False
        if higher:
            # A lowered cap: count what is above it before touching any lock.
            locks = held_locks()
            views = [self._view(key, i, cap, locks) for i in higher]
            taken = [v for v in views if v.state in TAKEN]
            if len(taken) >= cap:
                raise _Full(UNREADABLE if any(v.state == UNREADABLE for v in taken) else "full")
        for index in range(cap):
            fd = self._lock(directory, index)
            if fd is None:
                continue
            try:
                path = f"{directory}/slot-{index}.json"
                record = read_slot_record(path)
                if record is not None and not record["released"] and record.get("work") is not None:
                    if work_alive(record["work"], path):
                        os.close(fd)  # orphaned: counted, not taken
                        continue
            except RecordError:
                os.close(fd)
                unreadable = True
                continue
            except BaseException:
                os.close(fd)
                raise
            if higher and not self._under_cap_with(key, cap, index, names):
                os.close(fd)
                raise _Full("full")
            took_over = record if record is not None and not record["released"] else None
            return index, fd, took_over
        raise _Full(UNREADABLE if unreadable else "full")

    def _under_cap_with(self, key: str, cap: int, index: int, names: list[str]) -> bool:
        """Holding `index`, is the key's count (every slot present, any index) still within the cap?"""
        locks = held_locks()
        others = (set(_indices(names)) | set(range(cap))) - {index}
        taken = sum(1 for i in others if self._view(key, i, cap, locks).state in TAKEN)
        return taken + 1 <= cap

    def _lock(self, directory: str, index: int) -> int | None:
        path = f"{directory}/slot-{index}.lock"
        try:
            return _try_lock(path)
        except FileNotFoundError:
            pass
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            return _try_lock(path)
        except OSError as e:
            raise os_failure("lock slot file", path, e) from None

    # -- reading

    def inspect(self, key: str) -> list[SlotView]:
        """Every slot of key (below the cap, and any taken one above it), taking no lock."""
        check_key(key, reserved_ok=True)
        return self._inspect_key(key, held_locks())

    def inspect_all(self) -> list[SlotView]:
        """Every key configured or with a directory under <state>/slots, `_machine` first."""
        locks = held_locks()
        views = []
        for key in self._keys():
            views.extend(self._inspect_key(key, locks))
        return views

    def _keys(self) -> list[str]:
        keys = set(self.caps.configured_keys())
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            names = []
        except OSError as e:
            raise os_failure("list slot directories in", self.root, e) from None
        # Stray names that are no key (a temp file, a hand-made directory) are not slots.
        keys.update(n for n in names if key_problem(n, reserved_ok=True) is None)
        return sorted(keys, key=lambda k: (k != MACHINE_KEY, k))

    def _inspect_key(self, key: str, locks: set) -> list[SlotView]:
        cap = self._cap(key)
        directory = self._dir(key)
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            names = []
        except OSError as e:
            error = f"unable to read slot directory {directory}: {e.strerror}"
            return [SlotView(key, i, cap, UNREADABLE, error=error) for i in range(max(cap, 1))]
        views = []
        for index in sorted(set(range(cap)) | set(_indices(names))):
            view = self._view(key, index, cap, locks)
            if index < cap or view.state != FREE:
                views.append(view)
        return views

    def _view(self, key: str, index: int, cap: int, locks: set) -> SlotView:
        directory = self._dir(key)
        try:
            locked = file_key(os.stat(f"{directory}/slot-{index}.lock")) in locks
        except FileNotFoundError:
            locked = False
        except OSError as e:
            return SlotView(
                key,
                index,
                cap,
                UNREADABLE,
                error=f"unable to stat {directory}/slot-{index}.lock: {e.strerror}",
            )
        path = f"{directory}/slot-{index}.json"
        try:
            record = read_slot_record(path)
        except RecordError as e:
            return SlotView(key, index, cap, UNREADABLE, error=str(e))
        live = record is not None and not record["released"]
        work = record.get("work") if live else None
        if locked:
            state = HELD if work is not None else RESERVED
        elif work is None:
            state = FREE
        else:
            try:
                state = ORPHANED if work_alive(work, path) else FREE
            except RecordError as e:
                return SlotView(key, index, cap, UNREADABLE, error=str(e), record=record)
        if state == FREE or not live:
            return SlotView(key, index, cap, state, record=record)
        return SlotView(
            key,
            index,
            cap,
            state,
            turn=record.get("turn"),
            holder=record.get("holder"),
            pid=None if work is None or work.get("guard") is None else work["guard"].get("pid"),
            groups=[] if work is None else list(work.get("groups") or []),
            since=record.get("updated_at"),
            record=record,
        )

    # -- reaping

    def reap(self, key: str | None = None, *, grace: float = 5.0) -> list[SlotView]:
        """End the work of every orphaned slot (of key, or of all keys); blocking.

        Returns the slots reaped, as they were seen orphaned. Slots whose work could not be
        confirmed gone stay orphaned and are listed in self.reap_failures with an error.
        """
        keys = [check_key(key, reserved_ok=True)] if key is not None else self._keys()
        locks = held_locks()
        # Unreadable with a readable slot record: only the guard record is unreadable.
        # Every candidate is found before any is reaped: ending a key slot's work also ends its
        # `_machine` slot's (the same work), which must then be released too, not skipped as free.
        candidates = [
            view
            for k in keys
            for view in self._inspect_key(k, locks)
            if view.state == ORPHANED or (view.state == UNREADABLE and view.record is not None)
        ]
        reaped, self.reap_failures = [], []
        for view in candidates:
            outcome = self._reap_slot(view, grace)
            if outcome is True:
                reaped.append(view)
            elif outcome is not None:
                view.error = outcome
                self.reap_failures.append(view)
        return reaped

    def _reap_slot(self, view: SlotView, grace: float) -> bool | str | None:
        """True when reaped; None when it is no longer orphaned (or another acts); else an error."""
        directory = self._dir(view.key)
        path = f"{directory}/slot-{view.index}.json"
        fd = self._lock(directory, view.index)
        if fd is None:
            return None  # someone holds it now: a holder, or another reaper
        try:
            record = read_slot_record(path)
            if record is None or record["released"] or record.get("work") is None:
                return None
            work = record["work"]
            try:
                guard, groups = work_groups(work, path)
            except RecordError:
                # The guard record cannot be read: end what the slot record itself names.
                guard, _, groups = _work_parts(work, path)
            cgroup = work.get("cgroup") if isinstance(work.get("cgroup"), str) else None
            ended = end_work(
                groups, guard=guard, turn=record.get("turn"), grace=grace, cgroup=cgroup
            )
            if not ended:
                return f"unable to end the work of slot {view.key}#{view.index}: still running after SIGKILL"
            record["released"] = True
            record["updated_at"] = self.clock()
            try:
                write_json(path, record, 0o600)
            except OSError as e:
                return f"unable to write slot record {path}: {e.strerror}"
            remove_cgroup(cgroup)  # confirmed empty; a second slot of the same work finds none
            return True
        except RecordError as e:
            return str(e)
        finally:
            os.close(fd)


def _indices(names: list[str]) -> list[int]:
    found = set()
    for name in names:
        if not name.startswith("slot-"):
            continue
        stem, dot, ext = name[5:].partition(".")
        if ext in ("lock", "json") and stem.isdigit():
            found.add(int(stem))
    return sorted(found)
