"""Linux specifics the guard needs: the child-subreaper flag (prctl via ctypes) and pidfds.

Stateless: nothing here survives the process. Setting the subreaper flag twice is harmless; it
is inherited by nobody (fork clears it), so each guard sets its own.
Standard library only.
"""

from __future__ import annotations

import ctypes
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
