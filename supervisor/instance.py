"""The single-instance lock: a supervisor holds `<state>/supervisor.lock` for its life
(`take_instance_lock`), and whether one runs is answered from it, without touching it.

`take_instance_lock`: flock'd for the daemon's life, its pid written in it; the kernel frees it
when the daemon dies, even by SIGKILL, so a stale lock never blocks a restart; a second daemon
finds it taken and says who runs (or waits for it, for `ccsup restart`'s take-over).

Design note. The question is answered before any request, without the daemon: its lock
(<state>/supervisor.lock) is looked up in /proc/locks by inode. Taking the lock, even for a moment
with LOCK_NB, would make a daemon starting at that instant see it taken and exit "already
running" (`ccsup start` polls `status` exactly while its daemon starts); a flock probe is the
fallback only where /proc/locks cannot be read. The first read of /proc/locks in a process waits
for the kernel to take its global file-lock semaphore for writing (an RCU grace period, about
10 ms here, and every flock on the machine waits with it), so the daemon's own answer is tried
first: the lock file holds its pid, and /proc/<pid>/fdinfo of the descriptor open on the lock file
lists the flock it holds. Only when that does not show the lock held is /proc/locks read.

Knows the lock file (its pid, its inode) and asks guardd.procs to read /proc; nothing of sockets
or the protocol: the client adds "and its control socket exists" and what a silent daemon means.
State: reads only; a missing lock file is "not held".
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from pathlib import Path

from guardd import procs

from .errors import AlreadyRunning, CcsupError, os_failure
from .paths import StatePaths


def not_running_message(state_dir: Path, start: str = "ccsup start") -> str:
    """What a command says with no supervisor; `start`: the command that starts one (the client
    gives the last start's, supervisor.config.last_start)."""
    return f"no supervisor is running on {state_dir}; start one with `{start}`"


def _held_by_recorded_pid(fd: int, st: os.stat_result) -> bool:
    """Whether the process whose pid the lock file records holds its flock (by that process's
    fdinfo); False when that cannot be shown: not a "no", only "ask /proc/locks"."""
    try:
        pid = int(os.pread(fd, 32, 0).decode("ascii").strip())
    except (OSError, ValueError):
        return False
    return procs.holds_flock(pid, st)


def lock_held(lock_path: Path) -> bool:
    """Whether some process holds the flock on lock_path (a missing file is not held)."""
    try:
        fd = os.open(lock_path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError as e:
        raise CcsupError(f"unable to open supervisor lock {lock_path}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if _held_by_recorded_pid(fd, st):
            return True
        try:
            return procs.file_key(st) in procs.held_locks()
        except OSError:
            pass  # /proc/locks cannot be read
        try:  # fallback probe: may, for an instant, look taken to a starting daemon
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return True
            raise CcsupError(f"unable to probe supervisor lock {lock_path}: {e.strerror}") from None
        return False
    finally:
        os.close(fd)


def take_instance_lock(paths: StatePaths, wait: float = 0.0) -> int:
    """Hold <state>/supervisor.lock for the daemon's life; AlreadyRunning when someone else does
    (still, after `wait` seconds: `ccsup restart`'s new supervisor, started while the old one
    hands over, takes the lock the moment the old one exits)."""
    try:
        fd = os.open(paths.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise os_failure("open", paths.lock, e) from None
    deadline = time.monotonic() + wait
    before = _lock_owner(fd) if wait > 0 else None
    held_before = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() < deadline:
                held_before = True
                time.sleep(0.002)  # before the event loop: nothing else runs here yet
                continue
            owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise AlreadyRunning(
                f"a supervisor is already running on {paths.root} (pid {owner})"
            ) from None
    # The lock is let go of before the process that held it has exited, and with it its slots'
    # locks: a supervisor taking over waits for that exit, so the slots it then reads are the
    # dead one's (orphaned, to adopt), never still held.
    while held_before and before is not None and procs.process_running(before):
        if time.monotonic() >= deadline:
            break
        time.sleep(0.002)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _lock_owner(fd: int) -> procs.Identity | None:
    """The running process the lock file names (the supervisor that holds it), if any."""
    try:
        return procs.identity_of(int(os.pread(fd, 32, 0).decode("ascii").strip()))
    except (OSError, ValueError):
        return None
