"""Reading the slot gate's state without taking it, and reaping orphaned slots.

Knows lock files, /proc/locks (whether a lock is held, by the file's device and inode, parsed once
per call: a reader never takes a lock, since a probe that took one even for a moment could make a
racer see the slot busy) and how a slot counts (free, reserved, held, orphaned, unreadable);
what a record holds is supervisor.slots.record's. SlotGate (supervisor.slots.gate) is a SlotReader that
also acquires. The state question is answered in supervisor.slots.gate and supervisor.slots.record.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from collections.abc import Callable, Container
from typing import TypedDict

from guardd.procs import file_key, held_locks
from guardd.record import RecordError, live_guard_of_turn, record_dir_scope

from ..caps import MACHINE_KEY, Caps, check_key, key_problem
from ..errors import CcsupError, os_failure
from ..guards.containment import remove_cgroup
from ..guards.reaper import end_work
from .record import (
    FREE,
    HELD,
    ORPHANED,
    RESERVED,
    UNREADABLE,
    SlotView,
    awaits_adoption,
    from_earlier_boot,
    live_work,
    newer_guard_alive,
    read_settled,
    read_slot_record,
    work_alive,
    work_groups,
    work_parts,
    write_slot_record,
    written_before_boot,
)

# A key that is not configured and has had no slot taken for this long is left out of `ps`
# (SlotReader.survey): a week, so that a key used every working day stays in sight, while the
# directories of keys tried once (10,000 of them made `ps` unanswerable) drop out.
FORGET_AFTER = 7 * 86400.0
_LOCK_RETRIES = 3  # a lock file replaced under us this many times in a row: treat the slot as busy


class KeyTally(TypedDict):
    """One key's slots by state, as `ps` tallies them (`slot_keys`): free ones are counted here,
    not listed; `free` is what is left of the cap."""

    key: str
    cap: int
    free: int
    reserved: int
    held: int
    orphaned: int
    unreadable: int


def _written_at(record: dict | None) -> float:
    """When a record was last written (its `updated_at`), 0 when unknown."""
    at = None if record is None else record.get("updated_at")
    return float(at) if isinstance(at, (int, float)) and not isinstance(at, bool) else 0.0


# ---- locks ---------------------------------------------------------------------------------


class LazyLocks:
    """held_locks(), read at the first question only (a view of this gate's own slots asks none)."""

    def __init__(self) -> None:
        self._held: set[tuple[int, int, int]] | None = None

    def __contains__(self, file_key: object) -> bool:
        if self._held is None:
            self._held = held_locks()
        return file_key in self._held


class BadLockFile(CcsupError):
    """A slot's lock file that is no lock file: a symlink, a FIFO, a directory.
    The slot counts as unreadable (taken); a person removes the file."""


def _open_lock(path: str) -> int:
    """The lock file at path, opened (made when missing); BadLockFile when it is not a regular
    file. O_NOFOLLOW: a symlink is refused, not followed; O_NONBLOCK: a FIFO does not block."""
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
            raise BadLockFile(
                f"unable to lock slot file {path}: it is not a regular file"
            ) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise BadLockFile(f"unable to lock slot file {path}: it is not a regular file")
    return fd


def _try_lock(path: str) -> int | None:
    """Lock the slot file at path without blocking: the fd, or None when someone else holds it."""
    for _ in range(_LOCK_RETRIES):
        fd = _open_lock(path)
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


class SlotReader:
    """The slots under `root` as readers see them, and their reaping. See supervisor.slots.gate."""

    root: str
    caps: Caps
    clock: Callable[[], float]
    reap_failures: list[SlotView]

    # -- paths

    def _dir(self, key: str) -> str:
        return f"{self.root}/{key}"

    def _cap(self, key: str) -> int:
        if key == MACHINE_KEY:
            # A leftover `_machine` directory without a machine cap: cap 0, so only taken slots show.
            return self.caps.machine_cap or 0
        return self.caps.cap_for(key)

    def _lock(self, directory: str, index: int) -> int | None:
        path = f"{directory}/slot-{index}.lock"
        try:
            return _try_lock(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise os_failure("lock slot file", path, e) from None
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            return _try_lock(path)
        except OSError as e:
            raise os_failure("lock slot file", path, e) from None

    # -- reading

    def inspect(self, key: str) -> list[SlotView]:
        """Every slot of key (below the cap, and any taken one above it), taking no lock."""
        check_key(key, reserved_ok=True)
        return self._inspect_key(key, LazyLocks())

    def inspect_all(self) -> list[SlotView]:
        """Every key configured or with a directory under <state>/slots, `_machine` first."""
        locks = LazyLocks()
        views = []
        for key in self.keys():
            views.extend(self._inspect_key(key, locks))
        return views

    def survey(self, now: float | None = None) -> tuple[list[SlotView], list[KeyTally]]:
        """What `ps` shows of the slots: the slots taken (any state but free, any index), and one
        tally per key of how many slots are in each state, free ones counted rather than listed.

        A key that is not configured, has no slot taken and whose records were last written more
        than FORGET_AFTER ago (or never) is forgotten: neither listed nor tallied. Its directory
        stays (lock files are never deleted, see supervisor.slots.gate); using the key again
        brings it back.
        """
        now = self.clock() if now is None else now
        configured = set(self.caps.configured_keys())
        locks = LazyLocks()
        taken: list[SlotView] = []
        tallies: list[KeyTally] = []
        for key in self.keys():
            views = self._inspect_key(key, locks)
            busy = [v for v in views if v.state != FREE]
            last = max((_written_at(v.record) for v in views), default=0.0)
            if not busy and key not in configured and last < now - FORGET_AFTER:
                continue
            cap = self._cap(key)
            tally = KeyTally(key=key, cap=cap, free=0, reserved=0, held=0, orphaned=0, unreadable=0)
            for view in busy:
                tally[view.state] += view.count  # type: ignore[literal-required]
            in_use = sum(v.count for v in busy)
            tally["free"] = max(0, cap - in_use)
            taken.extend(busy)
            tallies.append(tally)
        return taken, tallies

    def keys(self) -> list[str]:
        """Every key configured or with a directory under <state>/slots, `_machine` first."""
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

    def _inspect_key(self, key: str, locks: Container) -> list[SlotView]:
        cap = self._cap(key)
        directory = self._dir(key)
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            names = []
        except OSError as e:
            error = f"unable to read slot directory {directory}: {e.strerror}"
            return [SlotView(key, 0, cap, UNREADABLE, error=error, count=max(cap, 1))]
        # Only the indices with files: one without any is free (no lock, no record), and a cap
        # may be a million (see supervisor.slots.gate).
        views = []
        for index in sorted(set(_indices(names)) | self._own_indices(key)):
            view = self._view(key, index, cap, locks)
            if index < cap or view.state != FREE:
                views.append(view)
        return views

    def _own_indices(self, key: str) -> set[int]:
        """The indices of key this process holds through this object (SlotGate), else none."""
        return set()

    def _own_record(self, key: str, index: int) -> dict | None:
        """The record of a slot this process holds through this object (SlotGate), else None."""
        return None

    def _view(self, key: str, index: int, cap: int, locks: Container) -> SlotView:
        own = self._own_record(key, index)
        if own is not None:  # held here: the lock is ours and the record is what we wrote
            return self._judge(key, index, cap, own, True, "")
        directory = self._dir(key)
        try:
            lock_stat = os.lstat(f"{directory}/slot-{index}.lock")
            if not stat.S_ISREG(lock_stat.st_mode):  # a symlink or FIFO put there: no lock
                return SlotView(
                    key,
                    index,
                    cap,
                    UNREADABLE,
                    error=f"{directory}/slot-{index}.lock is not a regular file",
                )
            locked = file_key(lock_stat) in locks
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
            record = read_settled(path, locked)
        except RecordError as e:
            if not locked and written_before_boot(path):
                return SlotView(key, index, cap, FREE)  # torn by a power loss: nothing of it runs
            return SlotView(key, index, cap, UNREADABLE, error=str(e))
        return self._judge(key, index, cap, record, locked, path)

    def _judge(
        self, key: str, index: int, cap: int, record: dict | None, locked: bool, path: str
    ) -> SlotView:
        """The view of a slot whose lock state and record are known."""
        if record is None or record["released"] or from_earlier_boot(record):
            return SlotView(key, index, cap, RESERVED if locked else FREE, record=record)
        work = record.get("work")
        if locked:
            state = HELD if work is not None else RESERVED
        elif work is None:
            state = FREE
        else:
            try:
                state = ORPHANED if work_alive(work, path) else FREE
            except RecordError as e:
                return SlotView(key, index, cap, UNREADABLE, error=str(e), record=record)
        if state == FREE:
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
            argv=None if work is None else work.get("argv"),
            cwd=None if work is None else work.get("cwd"),
        )

    # -- reaping

    def reap(self, key: str | None = None, *, grace: float = 5.0) -> list[SlotView]:
        """End the work of every orphaned slot (of key, or of all keys); blocking.

        Returns the slots reaped, as they were seen orphaned. Slots whose work could not be
        confirmed gone stay orphaned and are listed in self.reap_failures with an error.
        """
        keys = [check_key(key, reserved_ok=True)] if key is not None else self.keys()
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
            elif isinstance(outcome, str):
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
            work = live_work(record)
            if record is not None and work is not None and work.get("guard") is None:
                # Its cgroup alone: its holder died before naming the guard; the guard's own
                # record names the turn, and it is judged as a named one would be.
                guards = os.path.join(os.path.dirname(self.root), "guards")
                found = live_guard_of_turn(guards, record.get("turn"))
                if found is not None:
                    work = {**work, "guard": found[0].to_json(), "record": found[1]}
            if record is None or work is None or awaits_adoption(work, path):
                return None  # free, or its guard waits to be adopted and ends it itself
            if newer_guard_alive(work, path):
                return None  # a later release's guard: left to finish, never ended blindly
            try:
                guard, groups = work_groups(work, path)
            except RecordError:
                # The guard record cannot be read: end what the slot record itself names.
                guard, _, groups = work_parts(work, path)
            # escapees of this state directory only: the scope of the guard record's directory
            guard_record = work.get("record")
            scope = (
                record_dir_scope(os.path.dirname(guard_record))
                if isinstance(guard_record, str)
                else None
            )
            cgroup = work.get("cgroup") if isinstance(work.get("cgroup"), str) else None
            ended = end_work(
                groups,
                guard=guard,
                turn=record.get("turn"),
                scope=scope,
                grace=grace,
                cgroup=cgroup,
            )
            if not ended:
                return f"unable to end the work of slot {view.key}#{view.index}: still running after SIGKILL"
            record["released"] = True
            record["updated_at"] = self.clock()
            try:
                write_slot_record(path, record)
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
