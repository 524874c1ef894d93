"""The zygote's wire: messages between the supervisor (guardd.zygote_handle) and its zygote
(guardd.zygote), and the fds they carry.

The wire: one AF_UNIX stream socketpair between the supervisor and its zygote. Each message is a
4-byte big-endian length and a `marshal`led tuple (exact for every str the environment can hold,
lone surrogates included; both ends are the same interpreter, and nobody else holds the socket):
  supervisor -> zygote   ("spawn", args, cwd, env) with the child's stdin, stdout and stderr fds
                         attached (SCM_RIGHTS);
  zygote -> supervisor   ("ready", pid) once, at start;
                         ("spawned", pid, start_ticks) with a pidfd on the child attached, or
                         ("failed", errno, operation) when the child could not be set up;
                         ("exited", pid, returncode) for each spawned child it reaps (Popen's
                         convention: -N for signal N).
Requests are answered one at a time, in order; the supervisor may send many before the first
answer (pipelined: it does not wait, and takes each answer on its event loop when it comes).
A spare (guardd.zygote) is handed a request the same way: the request as it came, its fds attached.

Stateless: a message is whole or not there yet (Inbox keeps the bytes and fds until it is).
"""

from __future__ import annotations

import array
import marshal
import os
import socket
import struct

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the guard's start pays)
if TYPE_CHECKING:
    from collections.abc import Sequence

_HEADER = struct.Struct(">I")
MAX_MESSAGE = 16 << 20  # a request larger than this goes the old way (the caller decides)
_MAX_FDS = 64  # ancillary room per read (a request carries 3, an answer 1; requests are pipelined)
_READ_SIZE = 1 << 16
# A plain int: `int & socket.MSG_CTRUNC` would run the flag enum's __rand__ (Python code) on every
# read, pages the zygote writes between two forks (each one a guard's own: see guardd.zygote).
_MSG_CTRUNC = int(socket.MSG_CTRUNC)


def encode(message: tuple) -> bytes:
    body = marshal.dumps(message)
    if len(body) > MAX_MESSAGE:
        raise ValueError(
            f"a zygote message of {len(body)} bytes is over the {MAX_MESSAGE}-byte limit"
        )
    return _HEADER.pack(len(body)) + body


class Inbox:
    """Bytes and fds as they come off the stream, cut into messages."""

    def __init__(self):
        self.data = bytearray()
        self.fds: list[int] = []

    def receive(self, sock: socket.socket) -> bool:
        """One read; False at EOF. BlockingIOError when nothing is there (non-blocking socket)."""
        data, ancdata, flags, _ = sock.recvmsg(
            _READ_SIZE, socket.CMSG_SPACE(_MAX_FDS * 4), socket.MSG_CMSG_CLOEXEC
        )
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
                self.fds.extend(fds)
        if flags & _MSG_CTRUNC:
            raise OSError("unable to read from the zygote socket: file descriptors were truncated")
        self.data += data
        return bool(data)

    def messages(self):
        while len(self.data) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self.data)
            if size > MAX_MESSAGE:
                raise OSError(f"unable to read from the zygote socket: a {size}-byte message")
            if len(self.data) < _HEADER.size + size:
                return
            body = bytes(self.data[_HEADER.size : _HEADER.size + size])
            del self.data[: _HEADER.size + size]
            yield marshal.loads(body)

    def take_fds(self, n: int) -> list[int]:
        if len(self.fds) < n:
            raise OSError(
                f"unable to read from the zygote socket: {n} fds expected, {len(self.fds)} came"
            )
        taken, self.fds = self.fds[:n], self.fds[n:]
        return taken

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


def send(sock: socket.socket, message: tuple, fds: Sequence[int] = ()) -> None:
    data = encode(message)
    sent = socket.send_fds(sock, [data], fds) if fds else sock.send(data)
    if sent < len(data):
        sock.sendall(data[sent:])
