"""Where everything of one supervisor lives inside its state directory.

The state directory is private to its user: created 0700, and refused when another user owns it or
group or others may write to it (anyone who can write there can take slots or plant sockets). One
of ours that is empty and that only we may write to (made with `mkdir`, 755 under the usual umask)
is made 0700 at start: nothing in it was ever exposed (`loose_but_empty`; `config check` says so, and the refusal otherwise).
Knows names and permissions; opens nothing but the directories it creates.

`turns/` is marked the top of a directory hierarchy (ext4's FS_TOPDIR_FL, as `chattr +T` does),
so that ext4 places each turn's directory, and the logs in it, in a block group of its own
choosing (its Orlov allocator) instead of next to `turns/`. Why: without a journal, ext4 skips
every inode freed in the last 30 s when it looks for a free one in a group, so making a file
near where many were removed costs up to a millisecond (a turn makes three in `turns/`), against
~0.1 ms in a group of its own (measured here: a turn directory and two logs after 5,000 removals
nearby, 0.66-1.77 ms plain, 0.17-0.41 ms marked). A filesystem without such flags ignores it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

from .errors import CcsupError, UsageError, os_failure

TURN_ID = re.compile(r"[A-Za-z0-9_-]{1,128}\Z")
IPC = "ipc://"
# <linux/fs.h>: FS_IOC_GETFLAGS and FS_IOC_SETFLAGS (_IOR/_IOW('f', 1|2, long) on x86_64 and
# arm64; the kernel reads and writes an int), and FS_TOPDIR_FL.
_GETFLAGS, _SETFLAGS, _TOPDIR = 0x80086601, 0x40086602, 0x00020000


def ipc_path(endpoint: str) -> str | None:
    """The socket file of an ipc:// endpoint; None for another transport."""
    return endpoint[len(IPC) :] if endpoint.startswith(IPC) else None


@dataclass(frozen=True)
class StatePaths:
    root: Path

    @property
    def lock(self) -> Path:
        """flock'd for the daemon's life: one supervisor per state directory."""
        return self.root / "supervisor.lock"

    @property
    def log(self) -> Path:
        return self.root / "ccsup.log"

    @property
    def guards(self) -> Path:
        return self.root / "guards"

    @property
    def slots(self) -> Path:
        return self.root / "slots"

    @property
    def turns(self) -> Path:
        return self.root / "turns"

    @property
    def queue(self) -> Path:
        return self.root / "queue.json"

    @property
    def finished(self) -> Path:
        return self.root / "finished.log"

    def endpoint(self, name: str) -> str:
        """The default ipc:// endpoint named `name` in the state directory (control, bus-in,
        bus-out, guard-bus): the one place these endpoints are made."""
        return f"{IPC}{self.root / name}"

    def turn_dir(self, turn_id: str) -> Path:
        if not TURN_ID.match(turn_id):
            raise ValueError(f"not a turn id: {turn_id!r}")
        return self.turns / turn_id

    def output_log(self, turn_id: str, stream: str) -> Path:
        return self.turn_dir(turn_id) / f"{stream}.log"

    def ensure(self) -> None:
        """Create the directory tree (0700) and refuse an unsafe state directory, or one this
        process cannot write to (UsageError, exit 2: the user must name another one)."""
        try:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            if loose_but_empty(self.root):
                os.chmod(self.root, 0o700)
            check_private(self.root)
            self._check_writable(self.root)
            for sub in (self.guards, self.slots, self.turns):
                sub.mkdir(mode=0o700, exist_ok=True)
                self._check_writable(sub)
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise self._not_writable(e.strerror) from None
            raise os_failure("create state directory", self.root, e) from None
        mark_top_directory(self.turns)

    def _check_writable(self, path: Path) -> None:
        # access(2) says EROFS for a read-only mount even to root; EACCES for another's directory.
        if not os.access(
            path, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids
        ):
            raise self._not_writable(
                "read-only file system" if _read_only(path) else "permission denied"
            )

    def _not_writable(self, why: str | None) -> UsageError:
        return UsageError(
            f"the state directory {self.root} is not writable ({(why or 'unknown').lower()}): "
            "ccsup keeps its locks, queue and sockets there; choose another with --state-dir "
            "or $CCSUP_STATE_DIR"
        )


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def mark_top_directory(path: Path) -> bool:
    """Set FS_TOPDIR_FL on the directory at path (see the module's note); False where the
    filesystem has no such flag or refuses it, which changes nothing else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        (flags,) = struct.unpack_from("i", fcntl.ioctl(fd, _GETFLAGS, bytes(8)))
        if not flags & _TOPDIR:
            fcntl.ioctl(fd, _SETFLAGS, struct.pack("i4x", flags | _TOPDIR))
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def loose_but_empty(path: Path) -> bool:
    """A directory of ours, empty, that group or others may read or enter but not write to:
    start makes it 0700 itself. One that others may write to is refused even empty: they could
    put something in it between our look and our chmod."""
    try:
        st = os.stat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or not st.st_mode & 0o077:
            return False
        if st.st_mode & 0o022:
            return False
        with os.scandir(path) as entries:
            return next(entries, None) is None
    except OSError:
        return False


def state_dir_refusal(path: Path) -> str | None:
    """Why start would refuse the state directory at path, without changing anything: None when
    it is private, missing (start makes it) or loose but empty (start makes it private)."""
    if not os.path.lexists(path) or loose_but_empty(path):
        return None
    try:
        check_private(path)
    except CcsupError as e:
        return e.message
    except OSError as e:
        return f"unable to read state directory {path}: {e.strerror}"
    return None


def check_private(path: Path) -> None:
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise CcsupError(f"state directory {path} is not a directory")
    if st.st_uid != os.geteuid():
        raise CcsupError(
            f"refusing state directory {path}: it belongs to uid {st.st_uid}, not to you "
            f"(uid {os.geteuid()}); use a directory of your own (--state-dir)"
        )
    if st.st_mode & 0o022:
        raise CcsupError(
            f"refusing state directory {path}: group or others may write to it "
            f"(mode {stat.S_IMODE(st.st_mode):o}); run `chmod 700 {path}`"
        )
    if st.st_mode & 0o077:
        # Its files are 0600, but their names (turn ids) and a file some tool made with the
        # umask's mode would be another user's to read: the directory is the owner's alone.
        raise CcsupError(
            f"refusing state directory {path}: group or others may read or enter it "
            f"(mode {stat.S_IMODE(st.st_mode):o}); run `chmod 700 {path}`"
        )
