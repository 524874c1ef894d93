"""The slot gate: a machine-wide cap per key, held as flock slots, with orphans found and reaped.

Knows flock, caps, which slot to take and when a slot counts; the records themselves (shape,
writing, reading, the boot rule, work liveness) are supervisor.slots.record's. Nothing of ZeroMQ or
asyncio.
Nothing here blocks on another holder: every lock is taken with LOCK_NB. Only `reap` blocks (it
waits for work to end), and the supervisor runs it in a thread.

Design note. A slot of key K is `<state>/slots/K/slot-<i>.lock` plus `slot-<i>.json`. Holding an
exclusive flock on the lock file *is* holding the slot: the kernel drops it when the holder dies,
even by SIGKILL, and keeps it for a stopped holder, so no liveness guess is ever needed for the
holder itself. Lock files are never deleted (unlinking a held lock file would let a second holder
lock a new file at the same path); after locking, the holder checks that the file it locked is
still the one at the path. The record says who holds the slot and what work runs under it; it is
written (in place, see write_slot_record) only by whoever holds the lock. The lock is the
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
can never exceed it. Nothing costs in proportion to the cap (a cap may be up to caps.MAX_CAP, a
million): a grant tries the indices it does not hold itself from the lowest up (its own lock would
refuse it anyway), so it passes over the slots in use and stops at the first free one, and it
reads the key's directory listing again only when the directory changed (it changes only when an
index is used for the first time). Readers (`inspect`, the lowered-cap count) look only at the
indices that have files: an index without any is free, and `ps` summarises the free ones per key. The
supervisor makes every configured index's files at its start (`prepare`, and again after a reload
for a raised cap), so a grant of a configured key then creates no file. After a lowered cap,
holders above it may remain: every slot file present is then counted (held, reserved, orphaned
and unreadable all count), before any lock is touched and again after one is taken, so no grant
happens until the count is under the cap. With a machine cap, the `_machine` key is a slot key of
its own, locked before the key's slot and unlocked again when the key is full; the two records
are written only once both locks are held.

The state question:
- Runs again / restarts: nothing is loaded; every call reads the files afresh. A restarted
  supervisor sees its old slots as orphaned (work alive) or free (work gone) and reaps the former.
- Stops half-way: killed after locking and before writing, the lock dies with it and the old record
  (released, or unreleased with dead work) reads as free. Killed after writing, the record says
  unreleased: free at once when it had no work, orphaned while recorded work lives. Killed after
  naming the turn's cgroup and before its guard ran (`Slot.name_cgroup`), orphaned while anything
  runs in that cgroup, free otherwise (the guard execs CMD only there and only while the
  supervisor lives). A crash inside a write leaves the old record or the new one (supervisor.slots.record).
- After a reboot (or power loss): a record of an earlier boot whose lock is free is free, whatever
  its work says; so is a record file that cannot be parsed but was last changed before this boot
  (supervisor.slots.record's boot rule). Old records without a boot id are judged by their work.
- Empty, corrupt or newer-version records of this boot, a directory that cannot be read, or a
  guard record named by the work that cannot be read: *unreadable*. So are planted files (issue
  27, B4): a record or guard record that is a symlink, a FIFO or over guardd.record's size bound
  (read_file: never followed, never blocked on, never read whole), and a lock file that is no
  regular file (BadLockFile: the grant passes over that index). Counted as taken, never handed out, shown
  with an error naming the file. Nothing here deletes or rewrites them; a person fixes or removes
  the file (a reaper does act on a slot whose own record is readable but whose guard record is not:
  it ends what it knows of and releases).
- No record yet, or a missing directory: free; directories are created (0700) on first acquire.
- Files made ahead (`prepare`): a lock file and a released record, written under the lock like any
  record, so a reader (of any version) sees a free slot. Killed half-way, what is made stands and
  the rest is made at the next start or by the first grant; an index that has any file, or whose
  lock someone holds, is never touched.

Limits: a fork without exec shares the lock (flock belongs to the open file description), so a
holder must not fork children that outlive it without exec; lock fds are O_CLOEXEC. Escapees known
only by their `CCSUP_TURN` marker are ended by the reaper but do not make a slot orphaned (finding
them means reading every process's environment, too slow for every acquire).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from guardd.procs import Group, Identity, available_memory, held_locks
from guardd.record import RecordError

from ..caps import MACHINE_KEY, TAKEN, Caps, check_key
from ..errors import CcsupError, UsageError, os_failure
from .record import (
    SLOT_VERSION,
    UNREADABLE,
    Holder,
    SlotView,
    live_work,
    open_record,
    read_slot_record,
    work_alive,
    write_slot_record,
    written_before_boot,
)
from .views import BadLockFile, SlotReader, _indices

_RACY_NS = 50_000_000  # a directory changed this recently may change again within its mtime tick
# Indices of a key made ahead at most (`prepare`): a cap meant as "no limit" (say 1000000) must not
# cost a file per index at start; the indices above it are made at their first use, as before.
PREPARE_MAX = 512


# ---- the gate ------------------------------------------------------------------------------


class _Full(Exception):
    """No slot for this key now; reason is "full" or "unreadable"."""

    def __init__(self, reason: str):
        self.reason = reason


class Slot:
    """A held slot: owns the flock fd in this process until release()."""

    def __init__(
        self, key, index, cap, fd, path, record, took_over, clock, machine=None, on_release=None
    ):
        self.key: str = key
        self.index: int = index
        self.cap: int = cap
        self.took_over: dict | None = took_over
        self.record: dict = record
        self.machine: Slot | None = machine  # the `_machine` slot taken with this one
        self._fd: int | None = fd
        self._path: str = path
        self._clock = clock
        self._on_release: Callable[[Slot], None] | None = on_release
        self._record_fd: int | None = None  # the record file, open while held

    @property
    def released(self) -> bool:
        return self._fd is None

    def _write(self) -> None:
        self.record["updated_at"] = self._clock()
        try:
            if self._record_fd is None:
                try:
                    self._record_fd = open_record(self._path)
                except FileNotFoundError:
                    pass  # the first record of this slot: write_slot_record creates it whole
            if not write_slot_record(self._path, self.record, self._record_fd):
                self._close_record()  # replaced by a long record: open the new file next time
        except OSError as e:
            raise os_failure("write slot record", self._path, e) from None

    def _close_record(self) -> None:
        if self._record_fd is not None:
            os.close(self._record_fd)
            self._record_fd = None

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

    def name_cgroup(self, cgroup: str) -> None:
        """Name the turn's cgroup as this slot's work before its guard is started. A holder killed
        from then on leaves the slot orphaned while anything runs in that cgroup, and the guard
        execs CMD only there and only while the supervisor still runs (guardd.child): no moment
        remains in which CMD runs under a slot that reads free."""
        self._check_held("record work in")
        self.record["work"] = {"guard": None, "record": None, "groups": [], "cgroup": cgroup}
        self._write()
        if self.machine is not None:
            self.machine.name_cgroup(cgroup)

    def record_work(
        self,
        guard: Identity,
        record_path: str,
        groups: list[Group],
        cgroup: str | None = None,
        *,
        command: dict | None = None,
    ) -> None:
        """Record the work running under this slot: a dead holder's slot then stays taken while it lives.

        command: {"argv", "cwd"} of the turn, for readers (`ps` of an orphan); kept from the
        previous record of the same work when not given."""
        self._check_held("record work in")
        old = self.record.get("work") or {}
        self.record["work"] = {
            "guard": guard.to_json(),
            "record": None if record_path is None else str(record_path),
            "groups": [g.to_json() for g in groups],
        }
        if cgroup is not None:
            self.record["work"]["cgroup"] = cgroup  # the turn's cgroup: the reaper ends it by that
        for name in ("argv", "cwd"):
            if command is not None and name in command:
                self.record["work"][name] = command[name]
            elif name in old:
                self.record["work"][name] = old[name]
        self._write()
        if self.machine is not None:
            self.machine.record_work(guard, record_path, groups, cgroup, command=command)

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
            self._close_record()
            os.close(fd)
            if self._on_release is not None:
                self._on_release(self)
            if self.machine is not None:
                self.machine.release()

    def __repr__(self) -> str:
        state = "released" if self._fd is None else "held"
        return f"<Slot {self.key}#{self.index} cap={self.cap} {state}>"


def _new_record(key, index, cap, holder: Holder, turn, reservation) -> dict:
    """A slot record as its holder first writes it."""
    return {
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


def _reservation(reservation: dict | None) -> dict | None:
    if reservation is None:
        return None
    try:
        return {"id": str(reservation["id"]), "until": float(reservation["until"])}
    except (KeyError, TypeError, ValueError):
        raise UsageError(
            f"bad reservation {reservation!r}: give {{'id': ..., 'until': epoch seconds}}"
        ) from None


class SlotGate(SlotReader):
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
        # What this gate itself knows, to make a grant cheap: the indices it holds (never worth
        # trying: its own lock refuses it too), and each directory's listing while unchanged.
        self._held: dict[str, set[int]] = {}
        self._own: dict[tuple[str, int], Slot] = {}  # the slots held, for views without I/O
        self._listings: dict[str, tuple[tuple[int, int], list[int]]] = {}

    # -- making slot files ahead

    def prepare(self, holder: Holder) -> int:
        """Make the slot files of every configured key, for each index below its cap (and below
        PREPARE_MAX) that has none: its lock file, and a released record (holder: `holder`)
        written under its lock. Returns how many slots were made; CcsupError or OSError when a
        file cannot be made.

        Why: otherwise a slot's first grant creates both files, and the key's directory changes,
        so the next grant lists it again. On a busy disk one file creation costs up to a
        millisecond; for 200 turns started at once on a fresh state directory that was half the
        event loop's time. Made here (at start, before anything is served), a grant only opens
        them. Nothing of this gate's memory is touched, and an index that someone holds, or that
        has any file already, is left as it is: any process may run this at any time.
        """
        made = 0
        for key in self.caps.configured_keys():
            directory, cap = self._dir(key), self._cap(key)
            try:
                present = set(_indices(os.listdir(directory)))
            except FileNotFoundError:
                present = set()
            for index in range(min(cap, PREPARE_MAX)):
                if index in present:
                    continue
                try:
                    fd = self._lock(directory, index)
                except BadLockFile:
                    continue  # a symlink or FIFO as its lock: shown unreadable, for a person
                if fd is None:
                    continue  # someone holds it: theirs to write
                try:
                    path = f"{directory}/slot-{index}.json"
                    if not os.path.exists(path):  # else written by a holder since the listing
                        record = _new_record(key, index, cap, holder, None, None)
                        record["released"], record["updated_at"] = True, self.clock()
                        write_slot_record(path, record)
                        made += 1
                finally:
                    os.close(fd)
        return made

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

    def adopt(
        self, key: str, index: int, holder: Holder, turn: str, guard: Identity
    ) -> Slot | None:
        """Take back the slot a dead holder left to a turn that is being adopted
        (supervisor.turns.adopt): its lock, when free, and its record, when it still names that
        turn and that guard, or that turn's cgroup alone (its holder died before it wrote the
        guard in: the adopter writes it, `record_work`); the record then names the new holder.
        None when the slot is not that turn's orphan any more (held, released, rewritten,
        unreadable): nothing is taken then.

        The slot read as orphaned until now (lock free, work alive): counted against the cap and
        never handed out, so no grant can have taken it in between."""
        check_key(key, reserved_ok=True)
        directory = self._dir(key)
        try:
            fd = self._lock(directory, index)
        except BadLockFile:
            return None
        if fd is None:
            return None
        path = f"{directory}/slot-{index}.json"
        try:
            record = read_slot_record(path)
            work = live_work(record)
        except (RecordError, OSError):
            work = None
        if (
            record is None
            or work is None
            or record.get("turn") != turn
            or work.get("guard") not in (guard.to_json(), None)
        ):
            os.close(fd)
            return None
        record = {**record, "holder": holder.to_json()}
        slot = Slot(
            key, index, self._cap(key), fd, path, record, None, self.clock, None, self._forget
        )
        try:
            return self._hold(slot)
        except BaseException:
            os.close(fd)
            raise

    def _make_slot(self, key, cap, claim, holder, turn, reservation, machine=None) -> Slot:
        index, fd, took_over = claim
        record = _new_record(key, index, cap, holder, turn, reservation)
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
            self._forget,
        )
        return self._hold(slot)

    def _hold(self, slot: Slot) -> Slot:
        """Count the slot as this gate's and write its record (undone when the write fails; its
        lock fd is then the caller's to close)."""
        self._held.setdefault(slot.key, set()).add(slot.index)
        self._own[slot.key, slot.index] = slot
        try:
            slot._write()
        except BaseException:
            slot._close_record()
            self._forget(slot)
            raise
        return slot

    def _forget(self, slot: Slot) -> None:
        self._held.get(slot.key, set()).discard(slot.index)
        self._own.pop((slot.key, slot.index), None)

    def _own_indices(self, key: str) -> set[int]:
        return set(self._held.get(key, ()))

    def _own_record(self, key: str, index: int) -> dict | None:
        slot = self._own.get((key, index))
        return None if slot is None else dict(slot.record)

    def _unheld_of(self, key: str, cap: int) -> Iterator[int]:
        """The indices below cap this gate does not hold, lowest first, made as they are asked:
        a grant looks at the slots in use and one more, never at every index below the cap."""
        held = self._held.get(key, ())
        return (i for i in range(cap) if i not in held)

    def _claim(self, key: str, cap: int) -> tuple[int, int, dict | None]:
        """Lock a free slot of key: (index, fd, the old unreleased record taken over or None)."""
        directory = self._dir(key)
        indices = self._listing(key, directory)
        higher = [i for i in indices if i >= cap]
        unreadable = False
        if higher:
            # A lowered cap: count what is above it before touching any lock.
            locks = held_locks()
            views = [self._view(key, i, cap, locks) for i in higher]
            taken = [v for v in views if v.state in TAKEN]
            if len(taken) >= cap:
                raise _Full(UNREADABLE if any(v.state == UNREADABLE for v in taken) else "full")
        # held is not changed in this loop: it returns first
        for index in self._unheld_of(key, cap):
            try:
                fd = self._lock(directory, index)
            except BadLockFile:  # a symlink or FIFO as its lock: counted as taken, never used
                unreadable = True
                continue
            if fd is None:
                continue
            try:
                path = f"{directory}/slot-{index}.json"
                try:
                    record = read_slot_record(path)
                except RecordError:
                    if not written_before_boot(path):
                        raise
                    record = None  # torn by a power loss: nothing of that boot runs
                work = live_work(record)
                if work is not None and work_alive(work, path):
                    os.close(fd)  # orphaned: counted, not taken
                    continue
            except RecordError:
                os.close(fd)
                unreadable = True
                continue
            except BaseException:
                os.close(fd)
                raise
            if higher and not self._under_cap_with(key, cap, index, indices):
                os.close(fd)
                raise _Full("full")
            took_over = record if record is not None and not record["released"] else None
            return index, fd, took_over
        raise _Full(UNREADABLE if unreadable else "full")

    def _listing(self, key: str, directory: str) -> list[int]:
        """The indices with files in the key's directory; _Full(UNREADABLE) when it cannot be read.

        Cached while the directory's mtime is unchanged and old enough that a change within the
        same timestamp tick cannot hide. Records are written in place, so the directory changes
        only when an index is used for the first time: after that, a grant lists nothing.
        """
        try:
            st = os.stat(directory)
        except FileNotFoundError:
            return []
        except OSError:
            raise _Full(UNREADABLE) from None
        stamp = (st.st_ino, st.st_mtime_ns)
        cached = self._listings.get(key)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        listed_at = time.time_ns()
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return []
        except OSError:
            raise _Full(UNREADABLE) from None
        indices = _indices(names)
        if st.st_mtime_ns < listed_at - _RACY_NS:
            self._listings[key] = (stamp, indices)
        return indices

    def _under_cap_with(self, key: str, cap: int, index: int, indices: list[int]) -> bool:
        """Holding `index`, is the key's count (every slot present, any index) still within the cap?"""
        locks = held_locks()
        # An index without files is free (no lock, no record): only those with files can count.
        others = (set(indices) | self._held.get(key, set())) - {index}
        taken = sum(1 for i in others if self._view(key, i, cap, locks).state in TAKEN)
        return taken + 1 <= cap
