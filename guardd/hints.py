"""Hints on the bus: `guard.<turn>.group|exited|gone`, published when the guard runs with --bus.

Design note. Hints are advisory: anyone may publish one and nothing may depend on them, so
publishing must never slow or endanger the turn. The guard only appends to a queue; a background
thread started after CMD is spawned connects, handshakes and sends; after a second without hints it
closes the connection and connects again for the next hint (a connection held for a turn's whole
life cost the supervisor ~24 KiB of ZeroMQ buffers per running turn; one made only at the first
hint delayed a short turn's end by a handshake).

The thread speaks ZMTP 3.0 itself (rfc.zeromq.org spec 23), as a PUB with the NULL mechanism, over
`ipc://` (an AF_UNIX stream socket; `ipc://@name` is the abstract namespace) or plain `tcp://`:
greeting, READY with Socket-Type PUB, then each hint as a topic frame (MORE) and a body frame.
Importing pyzmq and running its context cost 40-80 ms of CPU a turn, most of what a guard cost;
this costs a socket. A PUB filters by its peers' subscriptions; this one sends every hint to its
single peer (the supervisor's XSUB, which forwards to subscribers that filter), and because it
sends only after the handshake nothing is dropped for want of a subscription. What the peer sends
(subscriptions, commands) is read and discarded so it never fills a buffer.

Rejected: a CURVE tcp endpoint (the guard is given no keys; the handshake fails and hints are
dropped with one line on stderr); other transports (pgm, ws...) go to pyzmq when it can be
imported, else are dropped with one line on stderr.

Failures lose hints, never the turn: every socket operation has a deadline; OSError (peer absent,
gone, or slow) drops the hints silently, as a bus being down is not the turn's concern; a peer
that does not speak ZMTP 3 NULL drops them with one line on stderr. `close()` gives the final
hints at most `_CLOSE_WAIT` to be written and read by the peer (shutdown, then wait for the peer to
close), then returns regardless.

Holds no state beyond the process.
"""

from __future__ import annotations

import json
import queue
import socket
import struct
import sys
import threading
import time

_CONNECT_WAIT = 0.5  # seconds for connect, greeting and READY together
_CLOSE_WAIT = 0.1  # bound on delivering what is queued at close
_IDLE = 1.0  # seconds without a hint after which the connection is closed (reopened for the next)
_NOTHING = (b"", b"")  # "no hint yet": the first connection is made before there is one
_GREETING = (
    b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0") + b"\0" + bytes(31)
)
_MORE, _LONG, _COMMAND = 0x01, 0x02, 0x04


class ProtocolError(Exception):
    """The peer does not speak ZMTP 3 with the NULL mechanism."""


def frame(data: bytes, flags: int = 0) -> bytes:
    """One ZMTP frame: flags, a 1-byte size (or LONG and 8 bytes), the data."""
    if len(data) > 255:
        return struct.pack(">BQ", flags | _LONG, len(data)) + data
    return bytes((flags, len(data))) + data


def ready_command(socket_type: bytes = b"PUB") -> bytes:
    body = b"\x05READY" + b"\x0bSocket-Type" + struct.pack(">I", len(socket_type)) + socket_type
    return frame(body, _COMMAND)


def message(*frames: bytes) -> bytes:
    last = len(frames) - 1
    return b"".join(frame(f, 0 if i == last else _MORE) for i, f in enumerate(frames))


def open_stream(endpoint: str, timeout: float) -> socket.socket:
    """A connected stream socket for `ipc://path` or `tcp://host:port`; ValueError for others."""
    scheme, sep, address = endpoint.partition("://")
    if not sep:
        raise ValueError(f"not an endpoint: {endpoint!r}")
    if scheme == "ipc":
        path = "\0" + address[1:] if address.startswith("@") else address
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.settimeout(timeout)
            sock.connect(path)
        except BaseException:
            sock.close()
            raise
        return sock
    if scheme == "tcp":
        host, colon, port = address.rpartition(":")
        if not colon or not port.isdigit() or ";" in host:
            raise ValueError(f"unsupported tcp endpoint: {endpoint!r}")
        host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        sock = socket.create_connection((host, int(port)), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    raise ValueError(f"unsupported transport {scheme!r}")


def _recv_exact(sock: socket.socket, n: int, deadline: float) -> bytes:
    data = b""
    while len(data) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out in the handshake")
        sock.settimeout(left)
        try:
            chunk = sock.recv(n - len(data))
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            # libzmq closes at once, its greeting unsent, on a mechanism it does not accept.
            raise ProtocolError(
                "the peer closed the connection in the handshake (a CURVE"
                " endpoint? the guard speaks only NULL)"
            )
        data += chunk
    return data


def handshake(sock: socket.socket, deadline: float) -> None:
    """Greeting and READY both ways, as a PUB with the NULL mechanism."""
    # READY only after the peer's greeting: a peer that refuses our mechanism closes at once, and
    # input it left unread would turn its close into a reset that hides its greeting from us.
    sock.sendall(_GREETING)
    peer = _recv_exact(sock, 64, deadline)
    if peer[0] != 0xFF or not peer[9] & 1 or peer[10] < 3:
        raise ProtocolError("the peer does not speak ZMTP 3")
    mechanism = peer[12:32].rstrip(b"\0")
    if mechanism != b"NULL":
        raise ProtocolError(
            f"the peer wants the {mechanism.decode(errors='replace')} mechanism"
            " (the guard speaks only NULL)"
        )
    sock.sendall(ready_command())
    flags = _recv_exact(sock, 1, deadline)[0]
    if not flags & _COMMAND:
        raise ProtocolError("the peer sent a message before READY")
    size_bytes = _recv_exact(sock, 8 if flags & _LONG else 1, deadline)
    body = _recv_exact(sock, int.from_bytes(size_bytes, "big"), deadline)
    if body[:6] == b"\x05ERROR":
        raise ProtocolError(
            f"the peer refused: {body[7 : 7 + body[6:7][0]].decode(errors='replace')}"
            if len(body) > 6
            else "the peer refused"
        )
    if body[:6] != b"\x05READY":
        raise ProtocolError("the peer did not send READY")


def discard_input(sock: socket.socket) -> bool:
    """Read and drop what the peer sent (subscriptions); False once it has closed."""
    sock.setblocking(False)  # with a timeout set, Python would wait for input first
    while True:
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            return True
        if not data:
            return False


class Publisher:
    def __init__(self, endpoint: str, turn: str, guard: dict):
        self.endpoint = endpoint
        self.turn = turn
        self.guard = guard
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._close_by: float | None = None  # set by close(): the thread's last deadline
        self._thread = threading.Thread(target=self._run, name="guard-hints", daemon=True)
        self._thread.start()

    def publish(self, event: str, **fields) -> None:
        body = {"v": 1, "ts": time.time(), "turn": self.turn, "guard": self.guard, **fields}
        self._queue.put((f"guard.{self.turn}.{event}".encode(), json.dumps(body).encode()))

    def close(self, timeout: float = _CLOSE_WAIT) -> None:
        """Let the thread send what is queued and see the peer take it, for at most `timeout`."""
        self._close_by = time.monotonic() + timeout
        self._queue.put(None)
        self._thread.join(timeout)

    def _say(self, reason: str) -> None:
        print(f"ccsup-guard: unable to publish hints on {self.endpoint}: {reason}", file=sys.stderr)

    def _run(self) -> None:
        # Connected at once (a short turn's hints then cost no handshake at its end), and again
        # for the next hint after _IDLE without one.
        item: tuple[bytes, bytes] | None = _NOTHING
        while True:
            if item is not _NOTHING:
                item = self._queue.get()
                if item is None:
                    return
            try:
                sock = open_stream(self.endpoint, _CONNECT_WAIT)
            except ValueError:
                return self._run_zmq(item)
            except OSError:
                item = None  # no bus (or not yet, or no more): this hint is lost
                continue
            try:
                handshake(sock, time.monotonic() + _CONNECT_WAIT)
                if self._send_queued(sock, item):
                    return
            except ProtocolError as e:
                return self._say(str(e))
            except OSError:
                pass  # the peer went away or stalled: the hints in hand are lost
            finally:
                sock.close()
            item = None

    def _send_queued(self, sock: socket.socket, item: tuple[bytes, bytes] | None) -> bool:
        """Send item and what follows until close() (True) or _IDLE without a hint (False)."""
        while item is not None:
            if not discard_input(sock):
                return False
            if item is not _NOTHING:
                sock.settimeout(_CONNECT_WAIT)  # a stalled peer costs hints, never the guard's exit
                sock.sendall(message(*item))
            try:
                item = self._queue.get(timeout=_IDLE)
            except queue.Empty:
                break
        # Done for now: tell the peer, and wait (bounded) until it has read everything and closed
        # its end. Closing with unread input would make TCP reset the connection and lose data.
        sock.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + _CONNECT_WAIT
        while True:
            left = (self._close_by or deadline) - time.monotonic()
            if left <= 0:
                break
            sock.settimeout(left)
            if not sock.recv(65536):
                break
        return item is None

    def _run_zmq(self, first: tuple[bytes, bytes] | None) -> None:
        """Transports other than ipc and plain tcp, when pyzmq is importable."""
        try:
            import zmq
        except ImportError as e:
            return self._say(f"unsupported transport and no pyzmq ({e})")
        ctx = zmq.Context()
        sock = ctx.socket(zmq.PUB)
        try:
            sock.setsockopt(zmq.LINGER, int(_CLOSE_WAIT * 1000))
            sock.connect(self.endpoint)
            if first is not None and first is not _NOTHING:
                sock.send_multipart(first)
            while True:
                item = self._queue.get()
                if item is None:
                    break
                sock.send_multipart(item)
        except zmq.ZMQError as e:
            self._say(str(e))
        finally:
            sock.close()
            ctx.term()
