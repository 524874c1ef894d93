"""Hints on the bus: `guard.<turn>.group|exited|gone`, published when the guard runs with --bus.

Design note. Hints are advisory: anyone may publish one and nothing may depend on them, so
publishing must never slow or endanger the turn. The publisher has no thread: its one socket is
non-blocking, `publish` appends and sends what the socket takes at once, and the guard's own poll
loop hands it its socket's events and wakes it at its deadlines (`timeout`, `step`; `wait`
drives it alone, as `close` does). A thread cost each guard ~0.4 MiB of private
memory: with `threading` imported in the zygote every fork runs its at-fork hook, and a thread
has a stack, a thread state and a malloc arena of its own. It connects at once (a short turn's
hints then cost no handshake at its end); after a second without hints it closes the connection
and connects again for the next hint (a connection held for a turn's whole life cost the
supervisor ~24 KiB of ZeroMQ buffers per running turn).

It speaks ZMTP 3.0 itself (rfc.zeromq.org spec 23), as a PUB with the NULL mechanism, over
`ipc://` (an AF_UNIX stream socket; `ipc://@name` is the abstract namespace) or plain `tcp://`:
greeting, READY with Socket-Type PUB, then each hint as a topic frame (MORE) and a body frame.
Importing pyzmq and running its context cost 40-80 ms of CPU a turn, most of what a guard cost;
this costs a socket. A PUB filters by its peers' subscriptions; this one sends every hint to its
single peer (the supervisor's XSUB, which forwards to subscribers that filter), and because it
sends only after the handshake nothing is dropped for want of a subscription. What the peer sends
(subscriptions, commands) is read and discarded so it never fills a buffer.

Rejected: a CURVE tcp endpoint (the guard is given no keys; the handshake fails and hints are
dropped with one line on stderr; an `ipc://` peer that closes in the handshake has gone, as a
supervisor killed outright does, since the supervisor never gives a guard a CURVE ipc bus); other transports (pgm, ws...) go to pyzmq when it can be
imported, else are dropped with one line on stderr.

Failures lose hints, never the turn: nothing blocks (a `tcp://` endpoint by host name is resolved
at connect, synchronously: the supervisor always gives an `ipc://` one), and each step has a
deadline (connect, greeting and READY together, a send that makes no progress, the peer's close
after ours: `_CONNECT_WAIT` each); OSError or a deadline (peer absent, gone, or slow) drops the
hints in hand silently, as a bus being down is not the turn's concern, and the next hint connects
again; a peer that does not speak ZMTP 3 NULL drops them for good with one line on stderr.
`close()` gives the final hints at most `_CLOSE_WAIT` to be written and read by the peer
(shutdown, then wait for the peer to close), then returns regardless.

Holds no state beyond the process.
"""

from __future__ import annotations

import errno
import json
import os
import select
import socket
import struct
import sys
import time

_CONNECT_WAIT = 0.5  # seconds for connect, greeting and READY together
_CLOSE_WAIT = 0.1  # bound on delivering what is queued at close
_IDLE = 1.0  # seconds without a hint after which the connection is closed (reopened for the next)
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


def open_stream(endpoint: str) -> socket.socket:
    """A non-blocking stream socket connected (or connecting) to `ipc://path` or
    `tcp://host:port`; ValueError for other endpoints, OSError when it cannot connect."""
    scheme, sep, address = endpoint.partition("://")
    if not sep:
        raise ValueError(f"not an endpoint: {endpoint!r}")
    target: str | tuple
    if scheme == "ipc":
        path = "\0" + address[1:] if address.startswith("@") else address
        family, target = socket.AF_UNIX, path
    elif scheme == "tcp":
        host, colon, port = address.rpartition(":")
        if not colon or not port.isdigit() or ";" in host:
            raise ValueError(f"unsupported tcp endpoint: {endpoint!r}")
        host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        family, _, _, _, target = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)[0]
    else:
        raise ValueError(f"unsupported transport {scheme!r}")
    sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
    try:
        if family != socket.AF_UNIX:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # AF_UNIX connects at once or fails (EAGAIN: a backlog full, a bus too slow: no hints);
        # tcp is in progress until the socket turns writable.
        err = sock.connect_ex(target)
        if err not in (0, errno.EINPROGRESS):
            raise OSError(err, os.strerror(err))
    except BaseException:
        sock.close()
        raise
    return sock


def parse_greeting(peer: bytes) -> None:
    """The peer's 64-byte greeting: ZMTP 3 with the NULL mechanism, or ProtocolError."""
    if peer[0] != 0xFF or not peer[9] & 1 or peer[10] < 3:
        raise ProtocolError("the peer does not speak ZMTP 3")
    mechanism = peer[12:32].rstrip(b"\0")
    if mechanism != b"NULL":
        raise ProtocolError(
            f"the peer wants the {mechanism.decode(errors='replace')} mechanism"
            " (the guard speaks only NULL)"
        )


def parse_ready(data: bytes) -> int:
    """The peer's first frame, which must be READY: its length once whole, 0 while incomplete;
    ProtocolError for anything else."""
    if not data:
        return 0
    flags = data[0]
    if not flags & _COMMAND:
        raise ProtocolError("the peer sent a message before READY")
    head = 9 if flags & _LONG else 2
    if len(data) < head:
        return 0
    size = int.from_bytes(data[1:head], "big")
    if len(data) < head + size:
        return 0
    body = data[head : head + size]
    if body[:6] == b"\x05ERROR":
        raise ProtocolError(
            f"the peer refused: {body[7 : 7 + body[6:7][0]].decode(errors='replace')}"
            if len(body) > 6
            else "the peer refused"
        )
    if body[:6] != b"\x05READY":
        raise ProtocolError("the peer did not send READY")
    return head + size


_INF = float("inf")
# States: no connection; connected, handshake under way; open (hints flow); our end shut down,
# waiting (bounded) for the peer to read everything and close its end; given up for good.
_IDLE_STATE, _HANDSHAKE, _OPEN, _DRAINING, _DEAD = "idle", "handshake", "open", "draining", "dead"


class Publisher:
    """Hints to the bus over one non-blocking socket, driven by its owner's poll loop (or `wait`).

    poller: a select.poll the owner polls; the publisher (un)registers its socket there itself,
    and the owner wakes within `timeout()` and hands it each poll's events (`step`). Without one,
    `wait()` drives it."""

    def __init__(self, endpoint: str, turn: str, guard: dict, poller=None):
        self.endpoint = endpoint
        self.turn = turn
        self.guard = guard
        self.poller = poller
        self.state = _IDLE_STATE
        self.sock: socket.socket | None = None
        self._registered: tuple[int, int] | None = None  # (fd, events) on the poller
        self._out = bytearray()  # bytes for the peer: handshake, then hints
        self._in = bytearray()  # the peer's handshake so far
        self._greeted = False  # the peer's greeting is in (READY is next)
        self._pending: list[tuple[bytes, bytes]] = []  # (topic, body) waiting for the handshake
        self._deadline = _INF  # of the step under way
        self._idle_at = _INF  # open: when to let the connection go
        self._zmq: tuple | None = None  # (context, socket): a transport only pyzmq speaks
        self._connect()

    def publish(self, event: str, **fields) -> None:
        if self.state == _DEAD:
            return
        body = {"v": 1, "ts": time.time(), "turn": self.turn, "guard": self.guard, **fields}
        hint = (f"guard.{self.turn}.{event}".encode(), json.dumps(body).encode())
        if self._zmq is not None:
            return self._zmq_send(hint)
        if self.state == _OPEN:
            self._out += message(*hint)
            self._idle_at = time.monotonic() + _IDLE
            self._act(self._send)
            return
        self._pending.append(hint)
        if self.state == _IDLE_STATE:
            self._connect()

    # --- driven by the owner's loop -----------------------------------------------------------

    def fileno(self) -> int:
        return self.sock.fileno() if self.sock is not None else -1

    def timeout(self) -> float:
        """Seconds until the publisher has something to do without an event (inf: nothing)."""
        due = self._deadline if self._out else min(self._deadline, self._idle_at)
        return due if due == _INF else max(0.0, due - time.monotonic())

    def step(self, events: list[tuple[int, int]]) -> None:
        """After a poll of the owner's: act on its socket's events, then on passed deadlines."""
        fd = self.fileno()
        for ready, revents in events:
            if ready == fd:
                self.on_ready(revents)
        self.tick()

    def on_ready(self, revents: int) -> None:
        if revents & select.POLLOUT:
            self._act(self._send)
        if revents & (select.POLLIN | select.POLLHUP | select.POLLERR):
            self._act(self._receive)

    def tick(self) -> None:
        """Act on a passed deadline: the step under way failed, or the connection was idle."""
        now = time.monotonic()
        if now >= self._deadline:
            if self.state == _DRAINING:
                self._disconnect()  # the peer had its time to read the last hints
            else:
                self._lose()  # connect, handshake or a send made no progress in time
        elif now >= self._idle_at and self.state == _OPEN and not self._out:
            self._act(self._shut_down)

    def wait(self, timeout: float) -> None:
        """Poll the socket alone for at most `timeout` and act on what comes (no owner's loop)."""
        poller = select.poll()
        if self._registered is not None:
            poller.register(*self._registered)
        wait = min(timeout, self.timeout())
        self.step(poller.poll(max(0, int(wait * 1000) + 1)))

    def close(self, timeout: float = _CLOSE_WAIT) -> None:
        """Send what is queued and see the peer take it, for at most `timeout`; then stop."""
        end = time.monotonic() + timeout
        while self._zmq is None and self.state not in (_IDLE_STATE, _DEAD):
            left = end - time.monotonic()
            if left <= 0:
                break
            if self.state == _OPEN and not self._out:
                self._act(self._shut_down)
            else:
                self.wait(left)
        if self._zmq is not None:
            context, sock = self._zmq
            sock.close(linger=int(_CLOSE_WAIT * 1000))
            context.term()
            self._zmq = None
        self._pending.clear()
        self.state = _DEAD
        self._disconnect()

    # --- the steps ----------------------------------------------------------------------------

    def _act(self, step) -> None:
        try:
            step()
        except ProtocolError as e:
            self._say(str(e))
            self._pending.clear()
            self.state = _DEAD
            self._disconnect()
        except OSError:
            self._lose()  # the peer went away, refused, or stalled: the hints in hand are lost
        self._arm()

    def _connect(self) -> None:
        try:
            self.sock = open_stream(self.endpoint)
        except ValueError:
            self._open_zmq()
            return
        except OSError:
            self._lose()  # no bus (or not yet, or no more)
            return
        self.state = _HANDSHAKE
        self._greeted = False
        self._in.clear()
        self._out[:] = _GREETING
        self._deadline = time.monotonic() + _CONNECT_WAIT
        self._act(self._send)

    def _send(self) -> None:
        if self.sock is None or not self._out:
            return
        try:
            sent = self.sock.send(self._out)
        except BlockingIOError:
            sent = 0  # full, or a tcp connect still under way: POLLOUT comes back here
        del self._out[:sent]
        if self.state == _OPEN:  # a send that makes no progress for that long: a stalled peer
            if not self._out:
                self._deadline = _INF
            elif sent or self._deadline == _INF:
                self._deadline = time.monotonic() + _CONNECT_WAIT

    def _receive(self) -> None:
        if self.sock is None:
            return
        try:
            data = self.sock.recv(65536)
        except BlockingIOError:
            return
        except ConnectionResetError:
            data = b""
        if self.state == _HANDSHAKE:
            if not data and self.endpoint.startswith("ipc://"):
                self._lose()  # gone (a supervisor killed): no ipc bus of ours is CURVE
                return
            if not data:
                # libzmq closes at once, its greeting unsent, on a mechanism it does not accept.
                raise ProtocolError(
                    "the peer closed the connection in the handshake (a CURVE"
                    " endpoint? the guard speaks only NULL)"
                )
            self._in += data
            self._handshake()
        elif not data:  # the peer closed: drained, or gone
            if self.state == _DRAINING:
                self._disconnect()
            else:
                self._lose()
        # open: what the peer sends (subscriptions) is dropped, so it never fills a buffer

    def _handshake(self) -> None:
        # READY only after the peer's greeting: a peer that refuses our mechanism closes at once,
        # and input it left unread would turn its close into a reset that hides its greeting.
        if not self._greeted:
            if len(self._in) < 64:
                return
            parse_greeting(bytes(self._in[:64]))
            del self._in[:64]
            self._greeted = True
            self._out += ready_command()
            self._send()
        if not parse_ready(bytes(self._in)):
            return
        self._in.clear()
        self.state = _OPEN
        self._deadline = _INF
        self._idle_at = time.monotonic() + _IDLE
        self._out += b"".join(message(*hint) for hint in self._pending)
        self._pending.clear()
        self._send()

    def _shut_down(self) -> None:
        """Done for now: tell the peer, and wait (bounded) until it has read everything and
        closed its end. Closing with unread input would make TCP reset it and lose data."""
        assert self.sock is not None
        self.sock.shutdown(socket.SHUT_WR)
        self.state = _DRAINING
        self._idle_at = _INF
        self._deadline = time.monotonic() + _CONNECT_WAIT

    def _lose(self) -> None:
        self._pending.clear()
        self._disconnect()

    def _disconnect(self) -> None:
        """Close the connection (unregistered first); hints still pending connect again."""
        self._unregister()
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        self._out.clear()
        self._deadline = self._idle_at = _INF
        if self.state != _DEAD:
            self.state = _IDLE_STATE
            if self._pending:
                self._connect()

    def _arm(self) -> None:
        """The poller watches the socket for what the state waits on."""
        if self.sock is None:
            self._unregister()
            return
        wanted = (self.sock.fileno(), select.POLLIN | (select.POLLOUT if self._out else 0))
        if wanted == self._registered:
            return
        if self._registered is not None and self._registered[0] != wanted[0]:
            self._unregister()
        if self.poller is not None:
            self.poller.register(*wanted)  # for a registered fd: its new events
        self._registered = wanted

    def _unregister(self) -> None:
        if self._registered is not None:
            if self.poller is not None:
                self.poller.unregister(self._registered[0])
            self._registered = None

    def _say(self, reason: str) -> None:
        try:
            print(
                f"ccsup-guard: unable to publish hints on {self.endpoint}: {reason}",
                file=sys.stderr,
            )
        except OSError:
            pass  # stderr is gone (a supervisor killed outright): the turn must not end on it

    # --- transports other than ipc and plain tcp, when pyzmq is importable --------------------

    def _open_zmq(self) -> None:
        try:
            import zmq
        except ImportError as e:
            self._say(f"unsupported transport and no pyzmq ({e})")
            self.state = _DEAD
            return
        context = zmq.Context()
        sock = context.socket(zmq.PUB)
        try:
            sock.setsockopt(zmq.LINGER, int(_CLOSE_WAIT * 1000))
            sock.connect(self.endpoint)
        except zmq.ZMQError as e:
            sock.close()
            context.term()
            self._say(str(e))
            self.state = _DEAD
            return
        self._zmq = (context, sock)
        self.state = _OPEN
        for hint in self._pending:
            self._zmq_send(hint)
        self._pending.clear()

    def _zmq_send(self, hint: tuple[bytes, bytes]) -> None:
        import zmq

        assert self._zmq is not None
        try:
            self._zmq[1].send_multipart(list(hint), zmq.NOBLOCK)
        except zmq.Again:
            pass  # no peer yet, or it is slow: this hint is lost
        except zmq.ZMQError as e:
            self._say(str(e))
            self.close(0)
