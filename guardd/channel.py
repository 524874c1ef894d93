"""The guard's channel: how a supervisor that did not start a guard takes it over (adoption).

Design note. A guard started with `--adopt-within T` outlives its supervisor by up to T: when
the process it watches (its parent, or the pidfd a zygote handed it) is gone, the turn's work
keeps running, contained, and the guard waits for a new supervisor (guardd.guard). That one finds
the guard by its record (`"channel": {"v": 1, "path": ...}`) and speaks to it here: an owner-only
Unix socket (SOCK_SEQPACKET: one message a read, no framing), `<record-dir>/<pid>-<start>.sock`
beside the record, mode 0600, and a peer of another uid is refused whatever the mode (SO_PEERCRED).
It does not depend on the old supervisor, its zygote or the bus.

Version 1 of the wire: one JSON message a connection, `{"v": 1, "op": ...}`, one answer, and the
guard closes the connection (after an adopt, after its ack). An error answer is `{"v": 1, "ok":
false, "error"}` (a newer version, an unknown op, no pidfd with an adopt, a guard already
stopping) and changes nothing. The ops:
- "adopt", with a pidfd on the asker attached (SCM_RIGHTS): the process whose end ends the turn
  from now on. The guard answers `{"v": 1, "ok": true, "turn", "guard": {"pid", "start"},
  "waited_s", "stdin"}`, and the asker sends `{"v": 1, "op": "ack"}` on the same connection once
  it has read that answer: only then does the guard watch that pidfd instead. An asker that gave
  up before the answer came (the guard was stopped or starved past its timeout) closes instead,
  and the guard goes on waiting: it never watches a supervisor that does not know it adopted it.
  `stdin` true: a writer of CMD's stdin pipe is attached (SCM_RIGHTS), the adopter's to write the
  turn's stdin with from now on (guardd.stdin), or for a terminal turn a master of its pty, to
  write its input into and size (guardd.pty); false (or absent): there is none (/dev/null, or
  closed already).
- "close_stdin": the deliberate EOF of CMD's stdin. The guard closes the writer it holds (so the
  asker's own, closed next, is the last) and answers `{"v": 1, "ok": true}`, also when it held
  none. A guard older than this op answers `unknown op 'close_stdin'`: it held no writer, so the
  asker's close alone was the EOF, as it always was.
Ops are added within version 1 only when a guard without them answers "unknown op" and the asker
is right to carry on as before; anything else is a version 2, which a version 1 guard refuses.
Why a pidfd and not the peer's pid: the pid could be reused between the connect and the guard's
look; the pidfd is the very process.

State: the socket file lives as long as the guard (unlinked when it ends; one killed outright
leaves it behind: a connect to it is refused, ECONNREFUSED, and the reaper judges the guard by its
record as before). A guard never reads an old socket: its name holds its own identity.
"""

from __future__ import annotations

import json
import os
import socket
import struct

CHANNEL_VERSION = 1
_MAX = 4096


def channel_file(record_file: str) -> str:
    """The channel's path beside the guard's record (`<pid>-<start>.json` -> `.sock`)."""
    return record_file[: -len(".json")] + ".sock"


class Listener:
    """The guard's end: a listening socket, and the connections being answered."""

    def __init__(self, path: str):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        self.sock.setblocking(False)
        head, name = os.path.split(path)
        # Bound through the directory's fd: a state directory's path may be longer than the 107
        # bytes a socket address holds. umask: the file is made 0600 (owner-only) from the start.
        dir_fd = os.open(head or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        old = os.umask(0o177)
        try:
            try:
                os.unlink(path)  # a guard with our very identity died here before (pid reuse)
            except FileNotFoundError:
                pass
            self.sock.bind(f"/proc/self/fd/{dir_fd}/{name}")
        finally:
            os.umask(old)
            os.close(dir_fd)
        self.sock.listen(8)
        self.conns: dict[int, socket.socket] = {}

    def fileno(self) -> int:
        return self.sock.fileno()

    def accept(self) -> socket.socket | None:
        """A connection of our own uid, or None (another's is closed at once)."""
        try:
            conn, _ = self.sock.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return None
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", creds)
        if uid != os.getuid():
            conn.close()
            return None
        conn.setblocking(False)
        self.conns[conn.fileno()] = conn
        return conn

    def receive(self, fd: int) -> tuple[dict | None, int | None]:
        """The message on that connection and the fd it carried; (None, None) when it has none yet
        or it was not a message (the connection is then closed)."""
        conn = self.conns[fd]
        fds: list[int] = []
        try:
            data, ancdata, _flags, _ = conn.recvmsg(_MAX, socket.CMSG_SPACE(4 * 4))
        except (BlockingIOError, InterruptedError):
            return None, None
        except OSError:
            self.close_conn(fd)
            return None, None
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                usable = len(payload) - len(payload) % 4
                fds.extend(struct.unpack(f"{usable // 4}i", payload[:usable]))
        passed = fds[0] if fds else None
        for extra in fds[1:]:
            os.close(extra)
        try:
            message = json.loads(data)
        except ValueError:
            message = None
        if not isinstance(message, dict):
            if passed is not None:
                os.close(passed)
            self.close_conn(fd)
            return None, None
        return message, passed

    def answer(self, fd: int, body: dict, pass_fd: int | None = None, keep: bool = False) -> bool:
        """Send the answer; True when it was sent. pass_fd: an fd sent along (a copy: still ours).
        The connection is closed after, unless `keep` (an adopt's answer: its ack comes on it)
        and it was sent."""
        conn = self.conns.get(fd)
        if conn is None:
            return False
        data = json.dumps({"v": CHANNEL_VERSION, **body}).encode()
        rights = _rights(pass_fd) if pass_fd is not None else []
        try:
            conn.sendmsg([data], rights, socket.MSG_NOSIGNAL)
        except OSError:
            self.close_conn(fd)
            return False  # the asker is gone: nothing was changed for it to know
        if not keep:
            self.close_conn(fd)
        return True

    def close_conn(self, fd: int) -> None:
        conn = self.conns.pop(fd, None)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        for fd in list(self.conns):
            self.close_conn(fd)
        self.sock.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def _rights(fd: int) -> list[tuple[int, int, bytes]]:
    return [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", fd))]


def _connect(path: str, sock: socket.socket) -> None:
    # Through the directory's fd, as the guard bound it (a path may be longer than 107 bytes).
    head, name = os.path.split(path)
    dir_fd = os.open(head or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        sock.connect(f"/proc/self/fd/{dir_fd}/{name}")
    finally:
        os.close(dir_fd)


class Adopting:
    """An adopt asked and not yet answered: `Adopting(path)` connects and sends (OSError when the
    guard cannot be reached: a guard killed outright left its socket, ECONNREFUSED); `finish()`
    reads the answer and acks it. Two steps, so that a supervisor adopting many guards asks them
    all first and their answers come while it reads the first (supervisor.turns.adopt)."""

    def __init__(self, path: str):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            _connect(path, self.sock)
            pidfd = os.pidfd_open(os.getpid())
            try:
                message = json.dumps({"v": CHANNEL_VERSION, "op": "adopt"}).encode()
                self.sock.sendmsg([message], _rights(pidfd))
            finally:
                os.close(pidfd)  # the guard has its own copy now
        except BaseException:
            self.sock.close()
            raise

    def finish(self, timeout: float) -> dict:
        """The guard's answer (`ok` true or false) and `stdin_fd`: the writer of CMD's stdin that
        came with it (ours to close: see GuardProcess.take_stdin), or None. OSError when no
        answer came within `timeout` (the guard, not acked, goes on waiting) or it is garbage."""
        sock, path = self.sock, self.path
        fds: list[int] = []
        try:
            sock.settimeout(timeout)
            data, ancdata, _flags, _ = sock.recvmsg(
                _MAX, socket.CMSG_SPACE(4 * 4), socket.MSG_CMSG_CLOEXEC
            )
            for level, kind, payload in ancdata:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    usable = len(payload) - len(payload) % 4
                    fds.extend(struct.unpack(f"{usable // 4}i", payload[:usable]))
            try:
                answer = json.loads(data) if data else None
            except ValueError:
                answer = None
            if not data:
                raise OSError(
                    f"unable to adopt the guard at {path}: it closed the channel unanswered"
                )
            if not isinstance(answer, dict):
                raise OSError(f"unable to adopt the guard at {path}: it answered {data[:100]!r}")
            if answer.get("ok") is True:
                sock.send(json.dumps({"v": CHANNEL_VERSION, "op": "ack"}).encode())  # ours now
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        finally:
            sock.close()
        stdin_fd = fds.pop(0) if fds and answer.get("ok") is True and answer.get("stdin") else None
        for fd in fds:  # nothing else is ever sent: not ours to keep
            os.close(fd)
        answer["stdin_fd"] = stdin_fd
        return answer

    def close(self) -> None:
        """Give up without reading: the guard, never acked, goes on waiting."""
        self.sock.close()


def adopt(path: str, timeout: float = 2.0) -> dict:
    """The supervisor's end for one guard: ask it to be watched by us from now on (Adopting)."""
    return Adopting(path).finish(timeout)


def close_stdin(path: str) -> None:
    """The deliberate EOF: tell the guard behind `path` to close its writer of CMD's stdin.

    Does not wait for the answer (it is called from the supervisor's event loop): the message is
    queued on the connection, and the guard reads it even after we closed ours. Call it before
    closing our own writer, so that a supervisor dying between the two still leaves no writer.
    BlockingIOError when the guard's backlog is full (try again later); another OSError when the
    guard cannot be reached (it has ended, or never had a channel)."""
    sock = socket.socket(
        socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK
    )
    try:
        _connect(path, sock)
        sock.send(json.dumps({"v": CHANNEL_VERSION, "op": "close_stdin"}).encode())
    finally:
        sock.close()
