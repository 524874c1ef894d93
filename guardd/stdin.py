"""CMD's stdin across a supervisor's absence: the guard holds a writer of its pipe (adopt_within).

Design note. A "pipe" turn's stdin is a pipe whose write end is the supervisor's. A supervisor
that dies closes it, and with no writer left CMD reads EOF: an agent waiting for its next line
takes that as "the input is over". So a guard started with --adopt-within holds a write end of
that pipe too, from before CMD runs until the guard ends: while it does, the pipe has a writer
whoever dies, and CMD reads no EOF. The guard never writes into it (no byte of the hot path goes
through the guard): it hands a copy to the supervisor that adopts it (SCM_RIGHTS in the answer
to "adopt", guardd.channel), which writes CMD's stdin from then on. A deliberate EOF (a `send`
with eof) is the supervisor's channel op "close_stdin", which closes the guard's writer, then
the supervisor closes its own: EOF reaches CMD once the last writer is closed, as before.

Held from the start rather than taken when the supervisor is seen gone: a dying supervisor's
pipe end closes before its pidfd turns readable, and CMD could read that EOF first. Held for the
guard's whole life rather than until CMD exits: a supervisor, too, held its end until the guard
ended, so a descendant that reads the stdin CMD left it sees the same as before.

The writer is the pipe reopened through `/proc/self/fd/0` (Linux opens a pipe's inode there as a
FIFO: a new writer of the very pipe). Rejected: the supervisor passing its write end along (a
fourth fd in both the direct start and the zygote's wire, and an fd number in the arguments),
for the same result. Only a pipe (or FIFO) on fd 0 is held: "null" (/dev/null) needs nothing,
and a "tty" turn's stdin is the pty's, whose master the guard holds and hands over (guardd.pty).

State: one fd of the guard's, close-on-exec (CMD never gets it); nothing on disk. Gone with the
guard, however it ends.
"""

from __future__ import annotations

import os
import stat


def hold(fd: int = 0) -> int | None:
    """A new writer of the pipe on fd (close-on-exec, blocking); None when fd is not a pipe.
    OSError when it is one but cannot be reopened (no /proc)."""
    if not stat.S_ISFIFO(os.fstat(fd).st_mode):
        return None
    # O_WRONLY on a FIFO waits for a reader: we are one (fd), so it returns at once.
    return os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_CLOEXEC)
