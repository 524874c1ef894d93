"""A turn's cgroup (cgroup v2): find a writable hierarchy, create, join, kill, watch, measure, remove.

Design note. Process groups are the user's to change (setsid, setpgid) and the guard can only see
them by scanning; a cgroup is the kernel's own container: every process forked inside stays
inside whatever it does, `cgroup.kill` SIGKILLs all of them at once (no pid races), and
`cgroup.events` says `populated 0` when the last one has gone, with a file-modified notification
(poll() reports POLLPRI) rather than a poll loop. So where a cgroup2 hierarchy is writable, each
turn runs in one:

- the supervisor creates `<base>/ccsup.<supervisor pid>.<start ticks>/turn.<turn id>` (a parent per
  supervisor, so that two supervisors, or tests, never share a name) and hands the path to the
  guard (`--cgroup`); a `ccsup-guard --cgroup P` run by hand creates P if it is missing;
- the guard's forked child writes itself into `cgroup.procs` before it execs CMD: CMD never runs a
  moment outside (clone3's CLONE_INTO_CGROUP is not reachable from Python's os.fork). The guard
  itself stays outside: cgroup.kill must not end it, and `populated 0` must mean the work is gone;
- the end is the guard's usual SIGTERM round, then, after the grace, `cgroup.kill` together with
  the usual SIGKILL round; gone is `populated 0` (and, as before, no child and no live recorded
  group); the supervisor checks `populated 0` again before it releases, and removes the cgroup
  after the release (rmdir; the kernel refuses while anything is inside).

`auto` looks for a cgroup2 mount in /proc/self/mountinfo and takes the supervisor's own cgroup
(from /proc/self/cgroup), or its parent when the supervisor sits in a leaf named `supervisor`
(the systemd unit's DelegateSubgroup=supervisor: see contrib/systemd), and uses it when this
process may create cgroups there. Nothing found: today's subreaper + groups path, said by
`status`. No controllers are needed for any of this (cgroup.kill, cgroup.events and cpu.stat exist
in every cgroup2 cgroup).

State: cgroups live in the kernel, not on disk; their paths are in the guard and slot records, so
a reaper or a restarted supervisor ends orphaned work by its cgroup and removes it. A cgroup whose
turn is gone but which could not be removed (still populated) stays for the reaper. A stale
per-supervisor parent (its supervisor dead) is removed when empty by the next supervisor's start.

Standard library only; knows cgroupfs, nothing of turns, slots or the bus.
"""

from __future__ import annotations

import errno
import os
import select

CGROUP2 = "cgroup2"
SUPERVISOR_LEAF = "supervisor"  # DelegateSubgroup= of the systemd unit: turns go beside it
PARENT_PREFIX = "ccsup."
TURN_PREFIX = "turn."


class CgroupError(OSError):
    """A cgroup operation failed; the message names the operation and the path."""


def _fail(operation: str, path: str, e: OSError) -> CgroupError:
    return CgroupError(e.errno, f"unable to {operation} {path}: {e.strerror}")


def cgroup2_mounts() -> list[str]:
    """Mount points of cgroup2 filesystems, from /proc/self/mountinfo."""
    found = []
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return []
    for line in lines:
        head, sep, tail = line.partition(" - ")
        if not sep:
            continue
        fields = head.split()
        if len(fields) >= 5 and tail.split()[:1] == [CGROUP2]:
            found.append(fields[4].replace("\\040", " "))
    return found


def own_cgroup() -> str | None:
    """This process's cgroup2 path relative to the hierarchy's root ("0::<path>"), or None."""
    try:
        with open("/proc/self/cgroup", "rb") as f:
            for line in f.read().decode(errors="replace").splitlines():
                if line.startswith("0::"):
                    return line[3:]
    except OSError:
        return None
    return None


def is_cgroup2(path: str) -> bool:
    """Is path a directory of a cgroup2 hierarchy (it has cgroup.procs and cgroup.events or is a
    root, which has no cgroup.events)?"""
    mounts = cgroup2_mounts()
    real = os.path.realpath(path)
    inside = any(real == m or real.startswith(m.rstrip("/") + "/") for m in mounts)
    return inside and os.path.isfile(os.path.join(real, "cgroup.procs"))


def usable(path: str) -> str | None:
    """None when this process may create cgroups under path, else why not (a sentence)."""
    if not os.path.isdir(path):
        return f"{path} is not a directory"
    if not is_cgroup2(path):
        return f"{path} is not in a cgroup2 hierarchy"
    if not os.access(path, os.W_OK) or not os.access(os.path.join(path, "cgroup.procs"), os.W_OK):
        return f"{path} is not writable by this user (no delegation)"
    return None


def find_auto() -> str | None:
    """The directory under which `auto` creates turns' cgroups, or None (see the design note)."""
    relative = own_cgroup()
    if relative is None:
        return None
    for mount in cgroup2_mounts():
        here = os.path.normpath(os.path.join(mount, relative.lstrip("/")))
        if os.path.basename(here) == SUPERVISOR_LEAF:
            here = os.path.dirname(here)
        if os.path.isdir(here) and usable(here) is None:
            return here
    return None


def supervisor_parent(base: str, pid: int, start: int) -> str:
    return os.path.join(base, f"{PARENT_PREFIX}{pid}.{start}")


def turn_cgroup(parent: str, turn: str) -> str:
    return os.path.join(parent, f"{TURN_PREFIX}{turn}")


def create(path: str) -> None:
    """mkdir -p for cgroups (each level is a cgroup); an existing one is an error only when it
    already holds processes (another turn's work)."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise _fail("create cgroup", path, e) from None
    if populated(path):
        raise CgroupError(errno.EEXIST, f"unable to use cgroup {path}: it already holds processes")


def join(path: str, pid: int = 0) -> None:
    """Move pid (0: the calling process) into the cgroup."""
    target = os.path.join(path, "cgroup.procs")
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, str(pid).encode())
        finally:
            os.close(fd)
    except OSError as e:
        raise _fail("join cgroup", path, e) from None


def populated(path: str) -> bool:
    """`populated 1` in cgroup.events; a missing cgroup is empty (rmdir only succeeds when empty)."""
    return read_keyed(os.path.join(path, "cgroup.events")).get("populated", 0) != 0


def read_keyed(path: str) -> dict[str, int]:
    """A flat-keyed cgroup file (`key value` lines) as ints; {} when it is missing."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return {}
    except OSError as e:
        if e.errno == errno.ENODEV:  # the cgroup is being removed
            return {}
        raise _fail("read", path, e) from None
    values = {}
    for line in data.split(b"\n"):
        parts = line.split()
        if len(parts) == 2:
            try:
                values[parts[0].decode()] = int(parts[1])
            except ValueError:
                continue  # "max" and the like
    return values


def kill(path: str) -> bool:
    """Write 1 to cgroup.kill: SIGKILL everything inside, now and what it forks meanwhile.
    False when the cgroup is already gone or the kernel has no cgroup.kill (before 5.14)."""
    try:
        fd = os.open(os.path.join(path, "cgroup.kill"), os.O_WRONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError as e:
        raise _fail("open cgroup.kill of", path, e) from None
    try:
        os.write(fd, b"1")
    except OSError as e:
        if e.errno == errno.ENODEV:
            return False
        raise _fail("kill cgroup", path, e) from None
    finally:
        os.close(fd)
    return True


def remove(path: str) -> bool:
    """rmdir the cgroup; True when it is gone (or never was), False when it still holds processes
    or children."""
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return True
    except OSError as e:
        if e.errno in (errno.EBUSY, errno.ENOTEMPTY):
            return False
        raise _fail("remove cgroup", path, e) from None
    return True


def watch_events(path: str) -> int | None:
    """cgroup.events opened and armed: it notifies (POLLPRI) when `populated` changes, and after
    each notification `rearm` arms it again. None when it cannot be opened."""
    try:
        fd = os.open(os.path.join(path, "cgroup.events"), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    rearm(fd)
    return fd


def rearm(fd: int) -> None:
    """Read a kernfs file that notified, so that its next change notifies again."""
    try:
        os.pread(fd, 4096, 0)
    except OSError:
        pass  # the cgroup is being removed: nothing more will come


def wait_empty(path: str, timeout: float) -> bool:
    """Block until `populated 0` (woken by cgroup.events' notification, not a sleep loop) or
    timeout; True when empty."""
    import time

    deadline = time.monotonic() + timeout
    try:
        fd = os.open(os.path.join(path, "cgroup.events"), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    try:
        poller = select.poll()
        poller.register(fd, select.POLLPRI)
        while populated(path):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            poller.poll(int(left * 1000) + 1)
        return True
    finally:
        os.close(fd)


def usage(path: str) -> dict[str, int]:
    """cpu.stat's usage (usec), memory.peak and memory.current (bytes) where the cgroup has
    them."""
    stat = read_keyed(os.path.join(path, "cpu.stat"))
    found: dict[str, int] = {k: stat[k] for k in ("user_usec", "system_usec") if k in stat}
    for name in ("peak", "current"):
        try:
            with open(os.path.join(path, f"memory.{name}"), "rb") as f:
                found[f"memory_{name}"] = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # no memory controller here
    return found


def remove_stale_parents(base: str, alive) -> None:
    """rmdir empty `ccsup.<pid>.<start>` parents whose supervisor is no longer running
    (alive(pid, start) says); best effort."""
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        if not name.startswith(PARENT_PREFIX):
            continue
        parts = name[len(PARENT_PREFIX) :].split(".")
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            continue
        if alive(int(parts[0]), int(parts[1])):
            continue
        parent = os.path.join(base, name)
        try:
            for child in os.listdir(parent):
                if os.path.isdir(os.path.join(parent, child)):
                    remove(os.path.join(parent, child))
            remove(parent)
        except OSError:
            continue
