"""Slot records: their shape, how they are written and read back, and what their work is.

Knows the record file (`slot-<i>.json`), the holder and the recorded work, this boot's id, and
guardd's process identity and group liveness; nothing of locks, caps or which slot to take (that is
supervisor.slots.gate, the gate, which calls in here).

Design note. The record is written only by the holder of the slot's lock, and read by the next
holder (after taking the lock), by a reaper (after taking the lock) and by readers such as `ps`
(without it). It is written in place: one `pwrite` at offset 0 of at most one page, padded with
spaces to the file's old length so it never needs a truncate (JSON allows trailing white space);
the first record of a slot creates the file the atomic way, so a record file is never empty.
A single-page write to the page cache is done whole or not at all, even under SIGKILL, so a
holder killed mid-write leaves the old record or the new one. A record longer than a page (a
turn with very many groups) is written the atomic way instead (temp file, rename). Neither is
fsynced: the temp file, fsync and rename cost about 0.6 ms and were the largest cost of a grant.
That is safe because of the boot rule below: a power loss is the only way to lose an unsynced
write, and after one nothing that any record names can still be running.

The boot rule: every record carries `boot`, this machine's boot id
(/proc/sys/kernel/random/boot_id) at the time of writing. A record whose `boot` is another boot's
describes work that ended with that boot: with its lock free it is **free**, whatever its work
says (pids and start ticks of an earlier boot could even match a process of this one). A record
file that cannot be parsed at all but was last changed before this boot began (a write torn by the
power loss) is free too when its lock is free. A record without `boot` (written by an older ccsup,
which fsynced) is judged by its work as before.

The state question:
- Runs again / restarts: nothing is kept in memory; every read goes to the file.
- Stops half-way: a holder killed inside a write leaves the old or the new record (above); killed
  inside the long-record path, at most a stray `.slot-<i>.json.<pid>.tmp`, which nothing reads.
- Old records (no `boot`): judged by their work. Records of an earlier boot: free when unlocked.
  Empty, corrupt or newer-version records of this boot, or a guard record named by the work that
  cannot be read: RecordError (the gate shows them *unreadable*, counted as taken).
- A reader without the lock can meet a write in progress: it reads again (`read_settled`).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

from guardd import procs
from guardd.procs import Group, Identity
from guardd.record import NewerRecord, RecordError, read_json, record_groups, write_json

from ..caps import SlotState
from ..guards.containment import cgroup_populated
from ..holder import LABELS, Holder  # noqa: F401  (re-exported: slot records hold a Holder)

SLOT_VERSION = 1
# The gate's and the views' short names for the slot states (supervisor.caps.SlotState).
FREE, RESERVED, HELD, ORPHANED, UNREADABLE = (
    SlotState.FREE,
    SlotState.RESERVED,
    SlotState.HELD,
    SlotState.ORPHANED,
    SlotState.UNREADABLE,
)
_PAGE = 4096
_READ_TRIES = 3  # a reader without the lock that meets a torn record reads again this often

_encode = json.JSONEncoder(separators=(",", ":")).encode
_boot_id: str | None = None
_boot_time: float | None = None


def boot_id() -> str:
    """This boot's id (read once per process)."""
    global _boot_id
    if _boot_id is None:
        with open("/proc/sys/kernel/random/boot_id") as f:
            _boot_id = f.read().strip()
    return _boot_id


def boot_time() -> float:
    """When this boot began, epoch seconds (`btime` of /proc/stat, read once per process)."""
    global _boot_time
    if _boot_time is None:
        with open("/proc/stat", "rb") as f:
            for line in f:
                if line.startswith(b"btime "):
                    _boot_time = float(line.split()[1])
                    break
            else:
                raise RecordError("unable to read the boot time from /proc/stat: no btime line")
    return _boot_time


@dataclass
class SlotView:
    """One slot as a reader sees it, without taking anything."""

    key: str
    index: int
    cap: int
    state: SlotState
    turn: str | None = None
    holder: dict | None = None
    pid: int | None = None  # the guard's
    groups: list[dict] = field(default_factory=list)
    since: float | None = None
    error: str | None = None
    record: dict | None = None
    argv: list[str] | None = None  # the turn's command, as its work was recorded
    cwd: str | None = None
    count: int = 1  # slots this view stands for: a key directory that cannot be read is all of them

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "key": self.key,
            "index": self.index,
            "cap": self.cap,
            "state": self.state,
            "turn": self.turn,
            "holder": self.holder,
            "pid": self.pid,
            "groups": self.groups,
            "since": self.since,
            "argv": self.argv,
            "cwd": self.cwd,
        }
        if self.error is not None:
            data["error"] = self.error
        if self.count != 1:
            data["count"] = self.count
        return data


# ---- writing -------------------------------------------------------------------------------


def write_slot_record(path: str, record: dict, fd: int | None = None) -> bool:
    """Write the record at path (the caller holds the slot's lock): in place, or atomically if long.

    fd: the record file, already open for writing (a holder keeps it open across its writes).
    Returns False when the file was replaced instead (a long record): an fd given is then stale.
    """
    record["boot"] = boot_id()
    body = _encode(record).encode()
    own = fd is None
    try:
        if fd is None:
            fd = open_record(path)
        size = os.fstat(fd).st_size
    except FileNotFoundError:
        fd, size = None, _PAGE + 1  # the first record: created whole, so it is never empty
    try:
        if fd is None or len(body) >= _PAGE or size > _PAGE:  # one write could not cover it
            write_json(path, record, 0o600, sync=False)
            return False
        if size > len(body):
            body += b" " * (size - len(body))
        os.pwrite(fd, body, 0)
        return True
    finally:
        if own and fd is not None:
            os.close(fd)


def open_record(path: str) -> int:
    """The record file at path opened for writing in place; FileNotFoundError when there is none.

    Never created here: a holder killed between creating and writing would leave an empty file,
    which reads as corrupt. The first record of a slot is written the atomic way instead.
    """
    return os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)


# ---- reading -------------------------------------------------------------------------------


def _bad_record(path: object, why: str) -> RecordError:
    return RecordError(f"{path} is not a usable slot record: {why}")


def work_parts(work: dict, path: object) -> tuple[Identity | None, str | None, list[Group]]:
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


def read_slot_record(path: str | os.PathLike) -> dict | None:
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
    boot = data.get("boot")
    if boot is not None and not isinstance(boot, str):
        raise _bad_record(path, "'boot' is not a string")
    work = data.get("work")
    if work is not None:
        if not isinstance(work, dict):
            raise _bad_record(path, "'work' is not an object")
        work_parts(work, path)
    return data


def read_settled(path: str, locked: bool) -> dict | None:
    """read_slot_record for a reader without the lock: a record met mid-write is read again."""
    for attempt in range(_READ_TRIES):
        try:
            return read_slot_record(path)
        except RecordError:
            if not locked or attempt == _READ_TRIES - 1:
                raise
    raise AssertionError("unreachable")


def from_earlier_boot(record: dict | None) -> bool:
    """Does this record name another boot than this one (so nothing it names can still run)?"""
    return record is not None and record.get("boot") not in (None, boot_id())


def written_before_boot(path: str) -> bool:
    """Was the file at path last changed before this boot began (a torn write of an earlier boot)?"""
    try:
        return os.stat(path).st_mtime < boot_time()
    except OSError:
        return False


def live_work(record: dict | None) -> dict | None:
    """The work a lock-free record still answers for: None when released, empty, or of an earlier boot."""
    if record is None or record["released"] or from_earlier_boot(record):
        return None
    return record.get("work")


def work_groups(work: dict, path: object = "slot record") -> tuple[Identity | None, list[Group]]:
    """Every group a record's work names: its own list plus the guard record's own group and groups.

    RecordError when the guard record exists but cannot be read (its groups are unknown).
    """
    guard, record, groups = work_parts(work, path)
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


def _live_guard(work: dict, path: object) -> tuple[Identity, str] | None:
    """The work's guard (pid + start) and its record's path, when that very guard still runs."""
    try:
        guard, record, _ = work_parts(work, path)
    except RecordError:
        return None
    if guard is None or record is None or not procs.process_running(guard):
        return None
    return guard, record


# Seconds past a waiting guard's own deadline (waiting_since + adopt_within) before a reaper acts:
# the guard's grace (not in its record; 5 s by default) and its loop's lateness.
ADOPTION_MARGIN = 10.0


def awaits_adoption(work: dict, path: object = "slot record", now: float | None = None) -> bool:
    """Is this work's guard alive and waiting to be adopted, within its own wait (guardd.channel)?
    Such a guard ends the work itself when nobody adopts it, so a reaper leaves it counted until
    then: a guard a supervisor could not speak to is never killed blindly. Its wait counts from
    when it saw its supervisor gone (`waiting_since`), else from its record's last change (a
    stopped guard that never looked is not waiting)."""
    found = _live_guard(work, path)
    if found is None:
        return False
    guard, record = found
    try:
        data = read_json(record)
        changed = os.stat(record).st_mtime
    except (OSError, RecordError):
        return False
    within, since = data.get("adopt_within"), data.get("waiting_since")
    if not isinstance(within, int | float) or within <= 0 or data.get("state") != "running":
        return False
    if not isinstance(data.get("channel"), dict) or data.get("guard") != guard.to_json():
        return False
    start = since if isinstance(since, int | float) else changed
    return (time.time() if now is None else now) < start + within + ADOPTION_MARGIN


def newer_guard_alive(work: dict, path: object = "slot record") -> bool:
    """Is this work's guard (pid + start, from the slot record) alive with a record of a newer
    version than ours (guardd.record.NewerRecord: a later release's guard)? We cannot know what
    it waits for nor speak to it, so a reaper never ends it blindly: its slot stays counted
    (unreadable) and is reaped once the guard is gone (its own rules end its work). A corrupt
    record is not this: its guard is one of ours, ended by what the slot record names."""
    found = _live_guard(work, path)
    if found is None:
        return False
    try:
        read_json(found[1])
    except NewerRecord:
        return True
    except (OSError, RecordError):
        return False
    return False


def work_alive(work: dict, path: object = "slot record") -> bool:
    """Is anything of this recorded work still running? RecordError when that cannot be known."""
    guard, groups = work_groups(work, path)
    if guard is not None and procs.process_running(guard):
        return True
    cgroup = work.get("cgroup")
    if isinstance(cgroup, str) and cgroup and cgroup_populated(cgroup):
        return True  # the kernel's word: something of the turn runs in its cgroup
    return bool(procs.live_groups(groups))  # one pass over /proc, whatever the number of groups
