"""A terminal turn's pty, held by its guard: the master's bytes are the stdout log, the slave is CMD's.

Design note. A "tty" turn (`ccsup run -t`) runs CMD on a pseudo-terminal. Whoever holds the pty's
master holds the terminal: once the last master is closed, the kernel hangs the slave up and CMD
gets SIGHUP. So the guard, which outlives its supervisor (guardd.guard's adopt_within), holds a
master too and reads it: the pty's output goes to `<log-dir>/stdout.log` as a pipe's would
(guardd.output), and a supervisor that dies closes its own master and nothing else.

The supervisor makes the pty (supervisor.guards.handle.open_stdio, sized to the client's window)
and starts the guard with the slave on fd 0 and a master on fd 2 (fd 1 is its start pipe, as for
any guard that writes logs). `take_master` keeps that master (close-on-exec, non-blocking) and
puts the slave on fds 1 and 2, so CMD inherits the slave on all three (guardd.child makes it its
controlling terminal) and the guard's own lines ("ccsup-guard: ...") reach the terminal too. The
supervisor keeps a master of its own (the same open file: one pty) only to write the turn's input
and set its size (TIOCSWINSZ): it never reads it, so the guard's read is the only reader and every
byte reaches the log once. A supervisor that adopts the guard is handed a master in the answer
(guardd.channel's `stdin`, as a pipe's writer is: guardd.stdin), and input and resizing work
again: no byte of the hot path goes through the guard. Rejected: the guard making the pty itself
(the supervisor would then need the master back over the channel before its first key, and a
turn without adopt_within has no channel); the guard relaying input and sizes over its channel
(a hop per key, and a second way to do what the master does).

The guard holds the slave on its fds 0-2 for its whole life, so the master never reads EIO (no
slave left) while the guard runs: its reads are those of any pipe.

State: one fd of the guard's, close-on-exec (CMD never gets it); nothing on disk. Gone with the
guard, however it ends; the pty goes with its last master.
"""

from __future__ import annotations

import os
import stat

_PTMX = (5, 2)  # the device of every pty master (/dev/ptmx, /dev/pts/ptmx)
MASTER_FD = 2  # where the supervisor puts the master for the guard


def take_master() -> int:
    """The pty master on fd 2, kept (close-on-exec, non-blocking); the slave on fd 0 put on fds
    1 and 2 as well, for CMD. OSError (ENOTTY) when fd 2 is not a pty's master or fd 0 no
    terminal: the guard was not started by a supervisor that gives it one."""
    st = os.fstat(MASTER_FD)
    if not stat.S_ISCHR(st.st_mode) or (os.major(st.st_rdev), os.minor(st.st_rdev)) != _PTMX:
        raise OSError(25, "fd 2 is not a pty's master")
    if not os.isatty(0):
        raise OSError(25, "fd 0 is not a terminal")
    master = os.dup(MASTER_FD)  # non-inheritable, as os.dup makes it
    os.set_blocking(master, False)
    os.dup2(0, 1)  # inheritable: CMD's stdout and stderr are the slave
    os.dup2(0, 2)
    return master
