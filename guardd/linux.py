"""Linux specifics the guard needs: the child-subreaper flag (prctl via ctypes), pidfds, the
process title and renameat2's atomic exchange (for guardd.record.Rewriter).

Stateless: nothing here survives the process. Setting the subreaper flag twice is harmless; it
is inherited by nobody (fork clears it), so each guard sets its own.
Standard library only.
"""

from __future__ import annotations

import ctypes
import errno
import os

PR_SET_CHILD_SUBREAPER = 36


def _prctl():
    libc = ctypes.CDLL(None, use_errno=True)
    prctl = libc.prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


def register_subreaper() -> None:
    """Make this process a child subreaper: orphaned descendants are reparented to it, not init."""
    if _prctl()(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
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


PR_SET_NAME = 15


def set_title(title: str, name: str) -> None:
    """Show this process as `title` in ps (its command line, rewritten in place) and `name` in
    top (comm, PR_SET_NAME: at most 15 bytes).

    A process forked from another without exec keeps its parent's command line: a guard forked by
    the zygote showed the zygote's `python -I -S -c ...`. The command line is the memory between
    arg_start and arg_end (fields 48 and 49 of /proc/self/stat); the process may write its own
    memory through /proc/self/mem, so the title is written there, cut to that length and padded
    with NULs (so /proc/<pid>/cmdline ends at the title). Python keeps its own copy of argv, so
    nothing of ours reads that memory again. Best effort: a failure leaves the old title.
    """
    try:
        prctl = _prctl()
        prctl.argtypes = [
            ctypes.c_int,
            ctypes.c_char_p,
            ctypes.c_ulong,
            ctypes.c_ulong,
            ctypes.c_ulong,
        ]
        prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        pass  # comm stays; the command line below is what ps shows by default
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        # fields[0] is field 3 of proc(5): arg_start is field 48, arg_end field 49.
        start, end = int(fields[45]), int(fields[46])
        if end <= start:
            return
        data = title.encode()[: end - start - 1].replace(b"\0", b" ")
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(start)
            mem.write(data + b"\0" * (end - start - len(data)))
    except (OSError, ValueError, IndexError):
        pass  # no /proc/self/mem (hardened kernels): the zygote's command line stays


RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_renameat2 = None


def exchange(a: str, b: str) -> bool:
    """Swap the files at paths a and b atomically (renameat2 with RENAME_EXCHANGE). False where it
    cannot be done (a filesystem without it, an old kernel or C library: the caller renames
    instead, or either file missing); OSError for anything else."""
    global _renameat2
    if _renameat2 is None:
        try:
            _renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
        except AttributeError:
            return False
        _renameat2.argtypes = [
            ctypes.c_int,
            ctypes.c_char_p,
            ctypes.c_int,
            ctypes.c_char_p,
            ctypes.c_uint,
        ]
        _renameat2.restype = ctypes.c_int
    if _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOENT):
        return False
    raise OSError(err, f"unable to exchange {a} and {b}: {os.strerror(err)}")
