"""Linux specifics the guard needs: the child-subreaper flag (prctl via ctypes), pidfds, a fork
straight into a cgroup (clone3 with CLONE_INTO_CGROUP, via ctypes), the process's name and title
(through /proc/self) and renameat2's atomic exchange (for guardd.record.Rewriter).

Stateless: nothing here survives the process. Setting the subreaper flag twice is harmless; it
is inherited by nobody (fork clears it), so each guard sets its own. The ctypes prototypes of
prctl, syscall and renameat2 are made once, at import: in the zygote, before any fork (made at
each call in each guard, a function object with its argtypes apiece, they cost it private memory
after the fork).
Standard library only.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal

PR_SET_CHILD_SUBREAPER = 36


# Loaded once (in the zygote: every guard forked from it has them); [name] makes a new function
# object each time, so one caller's argtypes never become another's.
_LIBC = ctypes.CDLL(None, use_errno=True)
# syscall(2) through a PyDLL: the GIL stays held through the call (see fork_into_cgroup).
_syscall_holding_gil = ctypes.PyDLL(None, use_errno=True)["syscall"]
_syscall_holding_gil.restype = ctypes.c_long
_ulong = ctypes.c_ulong
_prctl = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_int, _ulong, _ulong, _ulong, _ulong, use_errno=True
)(("prctl", _LIBC))


def register_subreaper() -> None:
    """Make this process a child subreaper: orphaned descendants are reparented to it, not init."""
    if _prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unable to set PR_SET_CHILD_SUBREAPER: {os.strerror(err)}")


def open_parent_pidfd() -> int | None:
    """A pidfd on the parent, or None when the parent is already gone.

    getppid() == 1 means we were already orphaned (reparented to init). The parent may die between
    getppid() and pidfd_open() and its pid be reused, so getppid() is read again once the pidfd is
    open: if it changed, the pidfd is of someone else and the parent is gone.
    """
    ppid = os.getppid()
    if ppid == 1:
        return None
    try:
        fd = os.pidfd_open(ppid)
    except OSError:
        # ESRCH: already gone. Anything else (EMFILE, no pidfd support) leaves us unable to watch
        # it; ending the turn at once is the safe reading.
        return None
    if os.getppid() != ppid:
        os.close(fd)
        return None
    return fd


SYS_CLONE3 = 435  # the same number on every architecture (the unified syscall table, Linux 5.3)
CLONE_INTO_CGROUP = 0x200000000  # Linux 5.7
_CLONE_ARGS = (
    "flags",
    "pidfd",
    "child_tid",
    "parent_tid",
    "exit_signal",
    "stack",
    "stack_size",
    "tls",
    "set_tid",
    "set_tid_size",
    "cgroup",
)


class _CloneArgs(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in _CLONE_ARGS]


def fork_into_cgroup(cgroup_fd: int) -> int:
    """fork(), the child born inside the cgroup whose directory cgroup_fd is open on: 0 in the
    child, its pid in the parent; OSError when the kernel refuses (ENOSYS before 5.7 or under a
    seccomp filter, or the reasons a join would fail).

    Why not fork and then write cgroup.procs: moving a process takes the kernel's
    cgroup_threadgroup_rwsem for writing, which waits for an RCU grace period unless another move
    happened just before: 15-20 ms a turn here when turns start one at a time. A child born in the
    cgroup takes it only for reading.

    Only for a single-threaded caller (the guard: its loop is its only thread): unlike os.fork,
    none of Python's or glibc's fork handlers run, which is safe only when no other thread can hold
    a lock.
    The GIL stays held through the call (PyDLL), so the child starts with it. The child must exec
    or _exit soon.
    """
    args = _CloneArgs(flags=CLONE_INTO_CGROUP, exit_signal=signal.SIGCHLD, cgroup=cgroup_fd)
    size = ctypes.c_size_t(ctypes.sizeof(args))
    pid = _syscall_holding_gil(ctypes.c_long(SYS_CLONE3), ctypes.byref(args), size)
    if pid < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return pid


def set_name(name: str) -> None:
    """Show this process as `name` in top (comm, at most 15 bytes), written to /proc/self/comm:
    what prctl(PR_SET_NAME) sets, without a ctypes call, whose objects a forked guard would touch
    (see set_title). Best effort."""
    try:
        fd = os.open("/proc/self/comm", os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, name.encode()[:15])  # comm cannot pwrite (ESPIPE)
        finally:
            os.close(fd)
    except OSError:
        pass  # ps and top show the zygote's name


def set_title(title: str) -> None:
    """Show this process as `title` in ps: its command line, rewritten in place.

    A process forked from another without exec keeps its parent's command line: a guard forked by
    the zygote showed the zygote's `python -I -S -c ...`. The command line is the memory between
    arg_start and arg_end (`command_line_span`); the process may write its own memory through
    /proc/self/mem, so the title is written there, cut to that length and padded with NULs (so
    /proc/<pid>/cmdline ends at the title). Python keeps its own copy of argv, so
    nothing of ours reads that memory again. Bare descriptors, not file objects: each object a
    forked guard touches costs it a page of its own (guardd.zygote, Memory). Best effort: a
    failure leaves the old title.
    """
    start, end = command_line_span()
    if end <= start:
        return
    try:
        data = title.encode()[: end - start - 1].replace(b"\0", b" ")
        fd = os.open("/proc/self/mem", os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.pwrite(fd, data + b"\0" * (end - start - len(data)), start)
        finally:
            os.close(fd)
    except OSError:
        pass  # no /proc/self/mem (hardened kernels): the zygote's command line stays


_command_line: tuple[int, int] | None = None


def command_line_span() -> tuple[int, int]:
    """Where this process's command line lies: arg_start and arg_end (fields 48 and 49 of
    /proc/self/stat), (0, 0) when unreadable. Read once: a fork keeps its parent's, so the zygote
    reads it (guardd.zygote.warm) and the guards it forks do not read it again."""
    global _command_line
    if _command_line is None:
        try:
            fd = os.open("/proc/self/stat", os.O_RDONLY | os.O_CLOEXEC)
            try:
                stat = os.read(fd, 4096)
            finally:
                os.close(fd)
            fields = stat.rsplit(b")", 1)[1].split()
            # fields[0] is field 3 of proc(5): arg_start is field 48, arg_end field 49.
            _command_line = (int(fields[45]), int(fields[46]))
        except (OSError, ValueError, IndexError):
            _command_line = (0, 0)
    return _command_line


RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_renameat2: ctypes._NamedFuncPointer | None
try:  # made at import, like prctl's (glibc 2.28 and later have it)
    _renameat2 = _LIBC["renameat2"]
    _renameat2.argtypes = [
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_uint,
    ]
    _renameat2.restype = ctypes.c_int
except AttributeError:
    _renameat2 = None


def exchange(a: str, b: str) -> bool:
    """Swap the files at paths a and b atomically (renameat2 with RENAME_EXCHANGE). False where it
    cannot be done (a filesystem without it, an old kernel or C library: the caller renames
    instead, or either file missing); OSError for anything else."""
    if _renameat2 is None:
        return False
    if _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOENT):
        return False
    raise OSError(err, f"unable to exchange {a} and {b}: {os.strerror(err)}")
