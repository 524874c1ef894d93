"""A live subscription to a supervisor's bus: events in order, with their gaps counted.

A subscription is live only once the supervisor has seen it; the client subscribes to its
topics and to a unique `ccsup.hello.<nonce>` topic, and `handshake` returns once the supervisor's
answer on that topic arrives (re-subscribing every 0.5 s, as the XPUB only answers a new
subscription). Every supervisor event carries `seq`; a subscription to everything ("") counts the
holes in it (`gaps`, and `on_gap`), so a caller can catch up with `ps`. A filtered subscription
sees holes by design and counts none. Anything on the bus that is not an event is dropped.

Knows the SUB socket it is given and the event encoding (protocol); nothing of control requests
(supervisor.client makes the socket). State: the socket and the events received but not yet read.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator

import zmq

from . import protocol

HELLO_PREFIX = "ccsup.hello."
HELLO_RETRY = 0.5
TERMINAL = ("released", "cancelled", "rejected")


def is_terminal(topic: str) -> bool:
    """Whether the topic is a turn's last event (released, cancelled, rejected)."""
    return topic.startswith("turn.") and topic.rsplit(".", 1)[-1] in TERMINAL


class Subscription:
    """A live SUB on the bus: recv(timeout) -> (topic, body) | None, iteration, close."""

    def __init__(
        self,
        sock: zmq.Socket,
        prefixes: list[str],
        *,
        on_gap: Callable[[int, int], None] | None = None,
    ):
        self._sock = sock
        self.prefixes = prefixes
        self.live = False
        self.gaps = 0  # events missed, by seq (counted only when subscribed to everything)
        self.on_gap = on_gap
        self._check_seq = "" in prefixes
        self._last_seq: int | None = None
        self._pending: list[tuple[str, dict]] = []
        for prefix in prefixes:
            sock.setsockopt(zmq.SUBSCRIBE, prefix.encode())

    def handshake(self, timeout: float) -> None:
        """Make the subscription live: subscribe to a fresh hello topic until the supervisor's
        answer on it arrives (`live`), or timeout; events that come first are queued."""
        hello = f"{HELLO_PREFIX}{uuid.uuid4().hex}".encode()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.live:
            self._sock.setsockopt(zmq.SUBSCRIBE, hello)
            retry_at = min(deadline, time.monotonic() + HELLO_RETRY)
            while not self.live:
                left = retry_at - time.monotonic()
                if left <= 0 or not self._sock.poll(int(left * 1000) + 1, zmq.POLLIN):
                    if time.monotonic() >= retry_at:
                        break
                    continue
                frames = self._sock.recv_multipart()
                if frames and frames[0] == hello:
                    self.live = True
                else:
                    self._accept(frames)
            self._sock.setsockopt(zmq.UNSUBSCRIBE, hello)

    def _accept(self, frames: list[bytes]) -> None:
        """Queue one received message, unless it is not an event or someone else's hello."""
        try:
            topic, body = protocol.decode_event(frames)
        except protocol.ProtocolError:
            return  # anyone may publish on the bus; garbage is not an event
        if topic.startswith(HELLO_PREFIX):
            return
        seq = body.get("seq")
        if self._check_seq and isinstance(seq, int) and not isinstance(seq, bool):
            if self._last_seq is not None and seq > self._last_seq + 1:
                missed = seq - self._last_seq - 1
                self.gaps += missed
                if self.on_gap is not None:
                    self.on_gap(self._last_seq + 1, seq)
            # a lower seq is a restarted supervisor: follow its count from here
            self._last_seq = seq
        self._pending.append((topic, body))

    def peek(self, timeout: float) -> bool:
        """Wait up to timeout for an event to be available without taking it."""
        if self._pending:
            return True
        deadline = time.monotonic() + timeout
        while not self._pending:
            left = deadline - time.monotonic()
            if left <= 0 or not self._sock.poll(int(left * 1000) + 1, zmq.POLLIN):
                if time.monotonic() >= deadline:
                    return False
                continue
            self._accept(self._sock.recv_multipart())
        return True

    def recv(self, timeout: float | None = None) -> tuple[str, dict] | None:
        """The next event, waiting up to timeout seconds (None: forever); None on timeout."""
        if timeout is None:
            while not self.peek(3600.0):
                pass
        elif not self.peek(timeout):
            return None
        return self._pending.pop(0)

    def __iter__(self) -> Iterator[tuple[str, dict]]:
        while True:
            yield self.recv()  # type: ignore[misc]

    def until_terminal(
        self, *, idle_check: Callable[[], None] | None = None, idle: float = 1.0
    ) -> Iterator[tuple[str, dict]]:
        """Events up to and including the first terminal one (released, cancelled, rejected).

        `idle_check` runs after every `idle` seconds without an event; it raises to end the wait
        (Client.check_running: the supervisor is gone, so no terminal event will come).
        """
        while True:
            event = self.recv(idle if idle_check else None)
            if event is None:
                idle_check()  # type: ignore[misc]
                continue
            yield event
            if is_terminal(event[0]):
                return

    def close(self) -> None:
        self._sock.close(linger=0)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
