"""A live subscription to a supervisor's bus: events in order, with their gaps counted.

A subscription is live only once the supervisor has seen it; the client subscribes to its
topics and to a unique `ccsup.hello.<nonce>` topic, and `handshake` returns once the supervisor's
answer on that topic arrives (re-subscribing every 0.5 s, as the XPUB only answers a new
subscription). Every supervisor event carries `seq`; a subscription to everything ("") counts the
holes in it (`gaps`, and `on_gap`), so a caller can catch up with `ps`. A filtered subscription
sees holes in `seq` by design, so it checks the family counters instead (see supervisor.daemon.server):
a subscription to turn topics also subscribes to the low-volume `supervisor.` family (its events
are used, not yielded, unless asked for), and counts a hole in a turn's `turn_seq`, in
`supervisor_seq`, or a `supervisor.turn_ended` past the last `turn_seq` it saw (`gaps`, and
`on_loss` with a `Loss`). A turn whose terminal event was lost then gets an inferred one
(`"inferred": true`, its state from `turn_ended`), so `until_terminal` always ends. Contiguity is
checked from the first event seen of a turn, or from its first event for a turn followed from
its request (`expect_turn`, as run_turn does). Anything on the bus that is not an event is
dropped.

Restarts. Every event names its supervisor run (`epoch`). An event of a new epoch is a restart,
not a loss: every count starts again from the first event seen of that run (what was published
before this subscription reached the new supervisor is not counted; a follower catches up from
the logs and the history, see supervisor.client.ride_through), and `epoch` says which run
published last. Only the families the server never forwards from others (`turn.`,
`supervisor.`, `slot.`) are believed: anyone may publish on the other topics. A body without `epoch` (an older supervisor) keeps the
old rule: a lower count is followed, not a hole.

Knows the SUB socket it is given and the event encoding (protocol); nothing of control requests
(supervisor.client makes the socket). State: the socket and the events received but not yet read.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import NamedTuple

import zmq

from ..wire import protocol

HELLO_PREFIX = "ccsup.hello."
HELLO_RETRY = 0.5
TERMINAL = protocol.TERMINAL_EVENTS
SUPERVISOR_PREFIX = "supervisor."
OWN_FAMILIES = ("turn.", "supervisor.", "slot.")  # the server never forwards them from others


class Loss(NamedTuple):
    """Events a subscription knows it missed: counter values first..last."""

    counter: str  # "seq", "turn_seq" or "supervisor_seq"
    turn: str | None  # the turn, for turn_seq
    first: int
    last: int


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
        on_loss: Callable[[Loss], None] | None = None,
    ):
        self._sock = sock
        self.prefixes = prefixes
        self.live = False
        self.gaps = 0  # events missed, by seq (everything) or by the family counters (narrow)
        self.on_gap = on_gap
        self.on_loss = on_loss
        self._check_seq = "" in prefixes
        self._last_seq: int | None = None
        self.epoch: str | None = None  # the supervisor run whose events came last
        # turn id -> the last turn_seq seen; None: followed, counted from its next event (a restart)
        self._turn_seq: dict[str, int | None] = {}
        self._turn_ended: set[str] = set()  # turns whose terminal event was seen
        self._supervisor_seq: int | None = None
        self._pending: list[tuple[str, dict]] = []
        for prefix in prefixes:
            sock.setsockopt(zmq.SUBSCRIBE, prefix.encode())
        # A narrow subscription to turn topics watches the low-volume supervisor family too.
        self._watching = not self._check_seq and any(p.startswith("turn.") for p in prefixes)
        if self._watching and not any(SUPERVISOR_PREFIX.startswith(p) for p in prefixes):
            sock.setsockopt(zmq.SUBSCRIBE, SUPERVISOR_PREFIX.encode())

    @property
    def socket(self) -> zmq.Socket:
        """The SUB socket, to wait on it beside other files (`ccsup top`'s zmq.Poller); read
        events with `recv`, never from the socket."""
        return self._sock

    def expect_turn(self, turn_id: str) -> None:
        """This turn's events are all to come (the subscription is older than the turn)."""
        self._turn_seq.setdefault(turn_id, 0)

    def _wanted(self, topic: str) -> bool:
        return any(topic.startswith(p) for p in self.prefixes)

    def _lost(self, loss: Loss) -> None:
        self.gaps += loss.last - loss.first + 1
        if self.on_loss is not None:
            self.on_loss(loss)

    def _check_epoch(self, body: dict) -> None:
        """A new supervisor run: every count starts again from the next event seen."""
        epoch = body.get("epoch")
        if not isinstance(epoch, str) or epoch == self.epoch:
            return
        if self.epoch is not None:
            self._last_seq = None
            self._supervisor_seq = None
            for turn_id in self._turn_seq:
                self._turn_seq[turn_id] = None
        self.epoch = epoch

    def _check_counters(self, topic: str, body: dict) -> None:
        """Narrow loss detection by turn_seq, supervisor_seq and supervisor.turn_ended."""
        if topic.startswith("turn."):
            turn_id, _, kind = topic[5:].rpartition(".")
            turn_seq = body.get("turn_seq")
            if type(turn_seq) is int:
                last = self._turn_seq.get(turn_id)
                if last is not None and turn_seq > last + 1:
                    self._lost(Loss("turn_seq", turn_id, last + 1, turn_seq - 1))
                self._turn_seq[turn_id] = turn_seq  # lower: a restarted supervisor
            if kind in protocol.TERMINAL_EVENTS:
                self._turn_ended.add(turn_id)
            return
        supervisor_seq = body.get("supervisor_seq")
        if type(supervisor_seq) is int:
            if self._supervisor_seq is not None and supervisor_seq > self._supervisor_seq + 1:
                self._lost(
                    Loss("supervisor_seq", None, self._supervisor_seq + 1, supervisor_seq - 1)
                )
            self._supervisor_seq = supervisor_seq
        ended_id = body.get("id")
        if topic != protocol.TURN_ENDED or not isinstance(ended_id, str):
            return
        self._turn_ended_seen(ended_id, body)

    def _turn_ended_seen(self, turn_id: str, body: dict) -> None:
        """`supervisor.turn_ended`: a tail past the last turn_seq seen was lost."""
        followed = turn_id in self._turn_seq
        last = self._turn_seq.pop(turn_id, None)  # nothing more comes of it: forget it
        final = body.get("turn_seq")
        if turn_id in self._turn_ended:
            self._turn_ended.discard(turn_id)
            return  # its end was seen
        if not followed or type(final) is not int:
            return  # a turn this subscription does not follow
        if last is not None and final > last:  # None: nothing seen of this run: no count to hold
            self._lost(Loss("turn_seq", turn_id, last + 1, final))
        state = body.get("state")
        if state in protocol.TERMINAL_EVENTS:
            inferred = {"id": turn_id, "key": body.get("key"), "inferred": True}
            self._pending.append((f"turn.{turn_id}.{state}", inferred))

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
        if topic.startswith(OWN_FAMILIES):  # the families nobody else may publish
            self._check_epoch(body)
        if self._watching:
            self._check_counters(topic, body)
            if not self._wanted(topic):
                return  # watched for losses only
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
            # Past the deadline, what is already there is still read (a zero-timeout poll).
            if not self._sock.poll(int(left * 1000) + 1 if left > 0 else 0, zmq.POLLIN):
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
