"""The turn's output, kept by its guard: CMD's stdout and stderr into `<log-dir>/<stream>.log`.

Design note. Before this, CMD's stdout and stderr were pipes whose read ends were the
supervisor's: a supervisor that died (a crash, the OOM killer, an upgrade) took them along, and
CMD's next write got SIGPIPE. Now the guard, which outlives its supervisor (guardd.guard's
adopt_within), holds them: CMD writes into two pipes of the guard's, and the guard's loop appends
each read to the stream's log, the exact bytes, and its arrival to `<stream>.idx` (16 bytes, `<Qd`:
the read's byte offset in the log and the epoch time; supervisor.output.line_times reads it). A
supervisor follows the logs (supervisor.output.follow), whoever started the guard, so output
never waits for a supervisor and none is lost while there is none. Rejected: CMD writing into the
log files directly (no copy at all), because then nothing could stop a log at its limit; the
guard holding a copy of the supervisor's pipe ends, because output would then block after 64 KiB
while no supervisor reads (Docker's live-restore does that).

A "tty" turn's output is its pty's, read from the master the guard holds (guardd.pty) into
the stdout log. Otherwise the pipes' write ends are the guard's own stdout and stderr (fds 1 and
2), so CMD inherits them as it always did, and the guard's own lines ("ccsup-guard: ...") reach the stderr log too. The
guard holds them itself, so its read ends never see EOF: the loop reads what is there when poll
says so, and everything left when CMD's outcome is known (`drain`, before the record that holds
the exit: a supervisor that reads the exit and then the log has every byte CMD wrote).

`limit` (the supervisor's [logs] turn_max_bytes): the two logs together stop growing at that
many bytes; what comes after is read and dropped (CMD never blocks on it), and the first cut is
kept in `truncated` (stream and offset) for the record.

State: the logs are append-only, opened with O_APPEND and created when missing; a log that
already holds bytes (a turn id is never run twice, so only if someone wrote there) is appended
to, its offsets counting from its size. The index is made at its stream's first read, so a silent
stream has none.
"""

from __future__ import annotations

import os
import struct
import time

STREAMS = ("stdout", "stderr")
_ENTRY = struct.Struct("<Qd")  # supervisor.output.line_times.ENTRY
_READ = 65536
_DRAIN_READS = 256  # at most this many reads a stream in one drain (16 MiB): a bound, not a goal


def _open_append(path: str) -> int:
    return os.open(
        path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600
    )  # the owner's alone


class Logs:
    """CMD's stdout and stderr, read from the guard's pipes and appended to their logs."""

    def __init__(self, log_dir: str, limit: int | None = None):
        self.dir = log_dir
        self.limit = limit
        self.logged = 0
        self.truncated: dict | None = None  # {"stream", "offset"} of the first cut
        self.fds: dict[int, int] = {}  # read end -> stream number
        self._logs: list[int] = []
        self._indexes: list[int | None] = [None, None]  # made at the first read (-1: cannot be)
        self.offsets: list[int] = []
        self.pty_master = -1  # a "tty" turn's (open)

    def open(self, pty_master: int | None = None) -> None:
        """Open the logs and put the pipes on fds 1 and 2 (CMD inherits them); before CMD starts.
        pty_master (a "tty" turn, guardd.pty): no pipes, the master's bytes are the stdout log
        (the pty merges the streams; the stderr log stays empty). OSError when a log cannot be
        opened."""
        for stream in STREAMS:
            fd = _open_append(os.path.join(self.dir, f"{stream}.log"))
            self._logs.append(fd)
            self.offsets.append(os.fstat(fd).st_size)
        if pty_master is not None:
            self.fds[pty_master] = 0
            self.pty_master = pty_master
            return
        for n in range(len(STREAMS)):
            r, w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
            os.set_blocking(w, True)  # CMD's end as a pipe always is
            os.dup2(w, n + 1)  # inheritable: CMD's stdout (1), stderr (2)
            os.close(w)
            self.fds[r] = n

    def read(self, fd: int) -> bool:
        """One read of that pipe, logged; False when it had nothing. A pty's master gives at most
        its line discipline's buffer (4 KiB) a read: it is read until it has no more, up to as
        much as a pipe gives, and logged as one read (one write of the log, one event on the bus:
        4 KiB events flooded a slow subscriber's queue)."""
        n = self.fds[fd]
        pieces: list[bytes] = []
        size = 0
        while size < _READ:
            try:
                data = os.read(fd, _READ - size)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:  # EIO: a pty with no slave left (guardd.pty): nothing more will come
                break
            if not data:
                break
            pieces.append(data)
            size += len(data)
            if fd != self.pty_master:
                break  # a pipe gives what it holds, up to _READ, in one read
        if not pieces:
            return False
        self._log(n, pieces[0] if len(pieces) == 1 else b"".join(pieces))
        return True

    def drain(self) -> None:
        """Read what the pipes hold now (bounded: a writer that never stops cannot hold us)."""
        for fd in self.fds:
            for _ in range(_DRAIN_READS):
                if not self.read(fd):
                    break

    def _log(self, n: int, data: bytes) -> None:
        offset = self.offsets[n]
        self.offsets[n] += len(data)
        if self.truncated is not None:
            return
        room = len(data) if self.limit is None else self.limit - self.logged
        piece = data if room >= len(data) else data[: max(room, 0)]
        if piece:
            index = self._indexes[n]
            if index is None:
                index = self._indexes[n] = self._open_index(n)
            try:
                if index >= 0:
                    os.write(index, _ENTRY.pack(offset, time.time()))
                os.write(self._logs[n], piece)
            except OSError:
                pass  # a full disk: the work goes on (containment matters more than its log)
            self.logged += len(piece)
        if len(piece) < len(data):
            self.truncated = {"stream": STREAMS[n], "offset": offset + len(piece)}

    def _open_index(self, n: int) -> int:
        try:
            return _open_append(os.path.join(self.dir, f"{STREAMS[n]}.idx"))
        except OSError:
            return -1  # its log goes on without times
