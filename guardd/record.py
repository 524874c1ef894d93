"""Atomic JSON records: the one place records are written and read back.

A record is written to a temporary file in the same directory whose name does not end in `.json`
(so a reader globbing `*.json` never sees a half-written one), fsynced (unless the writer says
why it need not be), then renamed over the
target: a reader sees the old record or the new one, never a mix. A crash mid-write leaves at most
a stray `.tmp` file, which readers ignore.

Reading (`read_file`): every state file is opened without following a symlink and without
blocking, must be a regular file, and is read up to a bound; what fails that is a RecordError
naming the file, which each caller handles as it handles a corrupt file (moved aside, or counted
as unreadable), so one planted file neither hangs nor stops the supervisor.

Standard library only, and plain os paths: pathlib cost the guard about 7 ms of every start.
"""

from __future__ import annotations

import errno
import json
import os
import stat

RECORD_VERSION = 1
_PAGE = 4096  # a write of at most this much, at offset 0, reaches the page cache whole


class RecordError(ValueError):
    """A record that cannot be used: unreadable, not JSON, not an object, or a newer version."""


class NewerRecord(RecordError):
    """A record of a version newer than this code knows: a later release's (after a downgrade,
    or while two releases share a state directory), whose fields may mean what we do not know."""


def encode(data: dict) -> bytes:
    """A record's bytes: compact JSON, keys sorted."""
    return json.dumps(data, separators=(",", ":"), sort_keys=True).encode()


def write_json(path: str | os.PathLike, data: dict, mode: int = 0o644, sync: bool = True) -> None:
    """Write data at path atomically; fsynced unless sync is False (see guardd.guard's record)."""
    path = os.fspath(path)
    head, name = os.path.split(path)
    tmp = os.path.join(head, f".{name}.{os.getpid()}.tmp")
    body = encode(data)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        try:
            done = 0
            while done < len(body):  # a full disk may take part of it: the rest then fails
                done += os.write(fd, body[done:])
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)  # a full disk gets its room back; the old file stands
        except OSError:
            pass
        raise


# A record is read whole, and at most this long: a guard record of a 2,000-process tree is tens of
# KiB; a 300 MB file put in a record's place was read whole at every periodic look.
RECORD_LIMIT = 16 << 20


def read_file(path: str | os.PathLike, limit: int = RECORD_LIMIT) -> bytes:
    """The bytes of the state file at path: the one way ccsup reads a file it keeps state in.

    Opened with O_NOFOLLOW | O_NONBLOCK: a symlink put in its place is refused (ELOOP) rather
    than followed, and a FIFO or device opens at once instead of blocking the reader (a
    supervisor's event loop: "did not answer") and is then refused as not a regular file. Read
    with plain descriptors (half the time of open().read(), which a `ps` of 500 turns pays 500
    times), in one read when it can, and never past `limit` bytes. FileNotFoundError passes
    through; any other OSError is the OS's (ELOOP for a symlink); RecordError when it is not a
    regular file or is longer than `limit`.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RecordError(f"{path} is not a regular file")
        if st.st_size > limit:
            raise RecordError(f"{path} is {st.st_size} bytes, over the limit of {limit}")
        pieces = []
        got = 0
        want = st.st_size + 1  # the whole file in one read, even if it just grew a byte
        while piece := os.read(fd, want):
            pieces.append(piece)
            got += len(piece)
            if got > limit:
                raise RecordError(f"{path} grew past the limit of {limit} bytes while read")
            want = 65536
    finally:
        os.close(fd)
    return b"".join(pieces)


class Rewriter:
    """One record rewritten at every change by its only writer (a guard's), creating no file.

    Design note. write_json creates a file for every version and frees the one it replaces; the
    creation holds the directory's lock, and on ext4 without a journal the new inode is searched
    for past every inode freed in the last minutes. 500 guards stopping at once, each writing its
    record twice in the one guards directory, spent most of the stop's CPU waiting on that lock.
    Here the previous version is kept as the `spare` (`.<name>.spare`, not `.json`: readers
    ignore it): the next version is written over it in place, padded with spaces to its length
    (JSON allows them; making a file shorter frees its block, which cost more than the write),
    and the two files are swapped with renameat2(RENAME_EXCHANGE). A reader opening the record
    sees the old version or the new one, as with write_json. One still reading a version when it
    is overwritten, two writes later, can read a mix of the two, as a lock-free reader of a slot
    record can (supervisor.slots.record): most likely one that does not parse (RecordError, read
    as "being replaced": the next look finds it), and every field of one that parses was written
    by the guard. The first version is renamed into place (there is nothing to swap with). The
    one written with `last` goes over the record itself, in place (one pwrite of at most a page,
    padded: done whole or not at all, even under SIGKILL), and the spare, if any, is removed, so
    that a writer that ends leaves no spare and a turn that ends cleanly (two versions) creates
    one file, not two: each creation on a busy ext4 costs 0.1-1 ms (without a journal it skips
    every inode freed in the last 30 s). A reader of the record at that moment can meet the mix
    described above. One killed outright leaves its spare beside its record. Where the exchange
    cannot be done, every version but the last is renamed into place, as write_json does. Not
    fsynced (the guard's record need not be: see guardd.guard).
    """

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self.spare = spare_file(self.path)
        self._written = False  # a version of ours is at path
        self._have_spare = False  # and the one before it is the spare

    def write(self, data: dict, *, last: bool = False) -> None:
        body = encode(data)
        if last and self._written and len(body) <= _PAGE and self._write_in_place(body):
            return
        fd = -1
        if self._have_spare:
            try:
                fd = os.open(self.spare, os.O_WRONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                self._have_spare = False  # someone removed it: a new one is made
        if fd < 0:
            fd = os.open(self.spare, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        _overwrite(fd, body)
        if self._written and not last:
            from guardd.linux import exchange

            self._have_spare = exchange(self.spare, self.path)
            if self._have_spare:
                return
        os.replace(self.spare, self.path)
        self._written = True
        self._have_spare = False

    def _write_in_place(self, body: bytes) -> bool:
        """The last version over the record (see the class); False when the record is gone."""
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        _overwrite(fd, body)
        if self._have_spare:
            try:
                os.unlink(self.spare)
            except FileNotFoundError:
                pass
            self._have_spare = False
        return True


def _overwrite(fd: int, body: bytes) -> None:
    """body at offset 0, padded with spaces to the file's length (never shorter: see Rewriter);
    closes fd."""
    try:
        size = os.fstat(fd).st_size
        if size > len(body):
            body += b" " * (size - len(body))
        os.pwrite(fd, body, 0)
    finally:
        os.close(fd)


def spare_file(path: str | os.PathLike) -> str:
    """The spare a Rewriter keeps beside the record at path (left behind by a killed writer)."""
    head, name = os.path.split(os.fspath(path))
    return os.path.join(head, f".{name}.spare")


def read_json(
    path: str | os.PathLike, max_version: int = RECORD_VERSION, limit: int = RECORD_LIMIT
) -> dict:
    """Read a record (read_file: no symlink, no FIFO, at most `limit` bytes), or raise
    RecordError naming the file. FileNotFoundError passes through."""
    try:
        raw = read_file(path, limit)
    except FileNotFoundError:
        raise
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise RecordError(f"unable to read {path}: it is a symbolic link") from None
        raise RecordError(f"unable to read {path}: {e.strerror}") from None
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise RecordError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise RecordError(f"{path} does not hold a JSON object")
    version = data.get("v")
    if not isinstance(version, int) or isinstance(version, bool):
        raise RecordError(f"{path} has no version field 'v'")
    if version > max_version:
        raise NewerRecord(
            f"{path} is version {version}, newer than this ccsup knows ({max_version})"
        )
    return data


# --- Guard records ----------------------------------------------------------------------------
# `<record-dir>/<guard pid>-<guard start>.json`, written by guardd.guard, read by the supervisor
# and its reaper. A guard killed outright leaves its last record behind; `groups_alive` then says
# whether the groups it recorded still run.


def record_file(record_dir: str | os.PathLike, guard) -> str:
    """The record file of the guard with this identity (anything with .pid and .start), as str."""
    return os.path.join(os.fspath(record_dir), f"{guard.pid}-{guard.start}.json")


def record_path(record_dir: str | os.PathLike, guard):
    """record_file as a pathlib.Path (imported here only: the guard itself uses record_file)."""
    from pathlib import Path

    return Path(record_file(record_dir, guard))


def live_guard_of_turn(record_dir: str | os.PathLike, turn: object):
    """(identity, record path) of a running guard whose record in record_dir names `turn`, a
    record of a newer version's too (its caller reads it again and tells); None. For a slot whose
    record names the turn's cgroup alone: its supervisor died between the guard's start and
    naming it there. The guard is its file's name, `<pid>-<start>.json`."""
    from guardd.procs import Identity, process_running

    if not isinstance(turn, str):
        return None
    try:
        names = os.listdir(record_dir)
    except OSError:
        return None
    for name in names:
        pid, _, start = name.removesuffix(".json").partition("-")
        if not (name.endswith(".json") and pid.isdigit() and start.isdigit()):
            continue
        path = os.path.join(os.fspath(record_dir), name)
        try:
            named = read_json(path, max_version=1 << 30).get("turn")
        except (OSError, RecordError):
            continue
        ident = Identity(int(pid), int(start))
        if named == turn and process_running(ident):
            return ident, path
    return None


# A turn's processes carry CCSUP_TURN=<turn> (the turn may read it) and CCSUP_SCOPE=<scope> in their
# environment, the scope naming the guard record directory (so the state directory) as
# "<st_dev>:<st_ino>": an escapee is ended only by the supervisor of its own state directory, never
# by another one (another user, another state directory) whose client chose the same turn id. The
# device and inode, not the path: one directory has one scope however its path is spelled.
TURN_ENV = "CCSUP_TURN"
SCOPE_ENV = "CCSUP_SCOPE"


def record_dir_scope(record_dir: str | os.PathLike) -> str | None:
    """The CCSUP_SCOPE value of a guard record directory; None when it cannot be read."""
    try:
        st = os.stat(record_dir)
    except OSError:
        return None
    return f"{st.st_dev}:{st.st_ino}"


def record_groups(record: dict) -> list:
    """The groups a guard record names: its own group (when CMD started) and every recorded one."""
    from guardd.procs import Group

    groups = []
    own = record.get("own_group")
    if own is not None:
        groups.append(Group.from_json(own))
    groups.extend(Group.from_json(g) for g in record.get("groups") or ())
    return groups


def groups_alive(record: dict) -> bool:
    """Does any group of this guard record still run anything (guardd.procs.live_groups: one
    pass over /proc for all of them)?"""
    from guardd.procs import live_groups

    return bool(live_groups(record_groups(record)))
