"""The supervisor's sockets: the control ROUTER and the bus proxy (XSUB in, XPUB out).

Design note. The proxy is ours rather than zmq.proxy() because the supervisor must look at what
passes: it subscribes its XSUB to everything, reads each message published on bus-in, hands
`request.*` and `guard.*` to the daemon, and forwards to bus-out only what others may publish.
Topics the supervisor alone speaks (`turn.`, `supervisor.`, `slot.`) are never forwarded from
publishers, so nobody can forge a turn's events. The supervisor's own events go straight out on
the XPUB with a per-supervisor `seq`. High-water marks are raised for bursts (the default 1000
lost up to half of a 100k burst here); a subscriber that still misses one sees a `seq` gap.

A bound in bytes per subscriber (`HwmByBytes`). ZeroMQ's high-water mark counts messages, and
an output chunk is up to ~64 KiB (more once JSON escapes it): at 500,000 messages a suspended
`ccsup events turn.` (Ctrl-Z) while a turn wrote 400 MB took the supervisor from 27 to 438 MiB,
all of it queued for that one subscriber. So the XPUB's SNDHWM follows the size of what is sent:
the mark is SUBSCRIBER_BYTES divided by the mean size of recent messages (an average over about
the last MEAN_WINDOW messages), set on the socket when it moves by half or doubles (libzmq 4.3
applies it to every existing pipe: ~15 us with 20 subscribers). A subscriber's queue then holds
about SUBSCRIBER_BYTES whatever the mix: a stream of 64 KiB chunks gets ~370 messages, a burst of
small events the full HWM. (A mark per message's own size class, tried first, set the mark of a
queue of thousands of small events from one large message: a fuzzed bus and a 100 MB stream on a
loaded machine lost events far below the budget.) Past it, that subscriber alone loses messages
(XPUB drops per pipe) and sees the gap by `seq` and its offsets; the log files are still exact.

Counters for narrow subscribers (`Counters`). `seq` counts every event, so only a subscriber to
everything can tell a hole from a filtered-out event, and subscribing to everything made each
sidecar receive and decode every turn's output. So each family also has its own count: a
`turn.<id>.*` event carries `turn_seq` (1, 2, ... for that turn's events in this supervisor's
life) and a `supervisor.*` event carries `supervisor_seq`. After a turn's terminal event the
server publishes `supervisor.turn_ended` {id, key, state, turn_seq: its last}. A sidecar that
follows one turn subscribes to `turn.<id>.` and `supervisor.` (low volume: one message per turn
end plus the supervisor's own) and sees every loss: a hole in `turn_seq`, a hole in
`supervisor_seq`, or a `turn_ended` whose `turn_seq` is past the last it saw (the tail, the
terminal event included, was lost). A restarted supervisor counts from 1 again (its
`supervisor.started` has `supervisor_seq` 1): a lower count is followed, not a hole.

The epoch. Every event also carries `epoch`, 8 random hex characters drawn once per supervisor
run (also in `status`), so a subscriber tells a restart (a new epoch: every count starts again at
1, and what it missed meanwhile is no loss on the bus) from a gap (the same epoch, a count that
jumped). Eight characters because only runs that follow each other must differ (1 in 4 billion
that two do), and the bytes are paid on every event.

Subscription handshake: the XPUB is verbose, so the server sees every subscription; one to a
topic starting with `ccsup.hello.` is answered at once with a message on exactly that topic. A
client that receives it knows its earlier subscriptions are live (they travel in order).

Oversized frames: the sockets drop peers sending messages over MAX_MESSAGE (never buffered);
frames between protocol.MAX_FRAME and that get an error reply without being parsed.

Client authentication (tcp:// only). CURVE alone encrypts and proves the server to the client,
but lets in any client that knows the server's public key, which is public by nature. So every
tcp:// socket is a CURVE server in the ZAP domain "ccsup", and the server answers ZAP (RFC 27)
itself on inproc://zeromq.zap.01 of its own context, in the event loop: a CURVE handshake is let
in only when the client's public key is in `curve["client_keys"]`; a refused client gets no
connection, so its requests and subscriptions go nowhere (it sees a timeout). The ZAP socket is
bound before any endpoint, so no handshake can happen without it (libzmq lets everyone in when no
ZAP handler is bound; ZAP_ENFORCE_DOMAIN makes it refuse instead, where libzmq offers it).
Rejected: zmq.auth's AsyncioAuthenticator, which does the same through a callback but also runs
address allow/deny lists and lets NULL through by default; ours is one pure function
(`zap_answer`) and a loop. ipc:// sockets (and the guards' private ipc guard bus) use no CURVE:
the state directory's permissions guard them, and libzmq asks ZAP nothing for a NULL socket
without a domain (were it to, `zap_answer` lets NULL in only outside the "ccsup" domain).

Knows ZeroMQ and the protocol's framing; nothing of turns, slots or pids.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import zmq
import zmq.asyncio
from zmq.utils import z85

from ..errors import ConfigError
from ..paths import ipc_path
from ..wire import protocol

if TYPE_CHECKING:
    from ..config import CurveKeys

log = logging.getLogger("ccsup.server")

HWM = 500_000  # the most messages a subscriber's queue holds (small events, in bursts)
SUBSCRIBER_BYTES = 32 << 20  # about what one subscriber's queue may hold on bus-out
MIN_SIZE = 128  # bytes: the mean is taken as at least this (the mark at most HWM anyway)
MIN_HWM = 16  # messages: even the largest (8 MiB) keeps a few queued
MEAN_WINDOW = 64  # messages: the mean size follows about this many of the latest
MAX_MESSAGE = 8 * protocol.MAX_FRAME
RESERVED_TOPICS = ("turn.", "supervisor.", "slot.")
SUPERVISOR_PREFIX = "supervisor."
HELLO = "ccsup.hello."
BUS_IN_BATCH = 16  # bus messages taken before the loop is let run (see _serve_bus_in)

RequestHandler = Callable[[protocol.Request], Awaitable[dict]]
BusHandler = Callable[[str, dict], None]
BadBusHandler = Callable[[str, dict | None, str], None]


ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # fixed by RFC 27: libzmq asks whatever is bound here
ZAP_DOMAIN = b"ccsup"
MAX_LOGGED_REFUSALS = (
    1000  # distinct refused keys logged; a flood of new keys stops filling the log
)


def check_endpoint(name: str, endpoint: str, curve: CurveKeys | None) -> None:
    if ipc_path(endpoint) is not None:
        return
    if endpoint.startswith("tcp://"):
        if not curve:
            raise ConfigError(
                f"endpoints.{name}: {endpoint} is a tcp:// endpoint; configure [endpoints.curve] keys "
                "or use an ipc:// endpoint"
            )
        if not curve.get("client_keys"):
            raise ConfigError(
                f"endpoints.curve.client_keys: {endpoint} (endpoints.{name}) is a tcp:// endpoint; list the "
                "public keys of the clients it lets in, or use an ipc:// endpoint"
            )
        return
    raise ConfigError(f"endpoints.{name}: {endpoint!r} must be an ipc:// or tcp:// endpoint")


def zap_answer(frames: list[bytes], allowed: frozenset[bytes]) -> tuple[list[bytes], bytes | None]:
    """The ZAP reply to one request, and the CURVE key it refused (None if it let the peer in).

    A request is [version, request_id, domain, address, identity, mechanism, *credentials]; CURVE
    credentials are the client's 32-byte public key. In the "ccsup" domain only CURVE with an
    allowed key passes; outside it only NULL (a socket we gave no domain, which is ipc://).
    """
    if len(frames) < 6 or frames[0] != b"1.0":
        request_id = frames[1] if len(frames) > 1 else b""
        return [b"1.0", request_id, b"500", b"malformed ZAP request", b"", b""], None
    request_id, domain, mechanism, credentials = frames[1], frames[2], frames[5], frames[6:]
    if domain == ZAP_DOMAIN:
        if mechanism == b"CURVE" and len(credentials) == 1 and credentials[0] in allowed:
            return [b"1.0", request_id, b"200", b"OK", z85.encode(credentials[0]), b""], None
        refused = credentials[0] if mechanism == b"CURVE" and len(credentials) == 1 else None
        return [b"1.0", request_id, b"400", b"client key not allowed", b"", b""], refused
    if mechanism == b"NULL":
        return [b"1.0", request_id, b"200", b"OK", b"", b""], None
    return [b"1.0", request_id, b"400", b"unknown ZAP domain", b"", b""], None


EPOCH_BYTES = 4  # 8 hex characters on every event: only runs that follow each other must differ


class Counters:
    """The counters each supervisor event carries, and this run's epoch (see the module note)."""

    def __init__(self) -> None:
        self.epoch = os.urandom(EPOCH_BYTES).hex()  # not secrets: it loads hashlib, thus OpenSSL
        self.seq = 0
        self.supervisor_seq = 0
        self.turns: dict[str, int] = {}  # turn id -> its last turn_seq, while it has not ended

    def stamp(self, topic: str, fields: dict) -> tuple[dict[str, int], dict | None]:
        """This event's counter fields, and the body of the `turn_ended` to follow it (or None)."""
        self.seq += 1
        counters = {}
        ended = None
        if topic.startswith("turn."):
            turn_id, _, kind = topic[5:].rpartition(".")
            turn_seq = self.turns.get(turn_id, 0) + 1
            counters["turn_seq"] = turn_seq
            if kind in protocol.TERMINAL_EVENTS:
                self.turns.pop(turn_id, None)
                ended = {"id": turn_id, "key": fields.get("key"), "state": kind}
                ended["turn_seq"] = turn_seq
            else:
                self.turns[turn_id] = turn_seq
        elif topic.startswith(SUPERVISOR_PREFIX):
            self.supervisor_seq += 1
            counters["supervisor_seq"] = self.supervisor_seq
        return counters, ended


def _bind(sock: zmq.Socket, what: str, endpoint: str) -> None:
    """Bind; an ipc:// socket file is created 0600 (umask) and made so (chmod) whatever the umask."""
    old_umask = os.umask(0o177)
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as e:
        raise ConfigError(f"{what}: unable to bind {endpoint}: {e}") from None
    finally:
        os.umask(old_umask)
    path = ipc_path(endpoint)
    if path is not None:
        os.chmod(path, 0o600)


def _send_nowait(sock: zmq.asyncio.Socket, frames: list[bytes]) -> bool:
    """Send without waiting; False when the high-water mark is reached (the message is dropped).

    pyzmq's asyncio socket completes a NOBLOCK send at once and puts any error in the future.
    """
    future = sock.send_multipart(frames, flags=zmq.NOBLOCK)
    assert isinstance(future, asyncio.Future)  # pyzmq's asyncio sockets return one
    error = future.exception() if future.done() else None
    if error is not None:
        if isinstance(error, zmq.Again):
            return False
        raise error
    return True


class HwmByBytes:
    """The bus-out XPUB's SNDHWM, following the mean size of what is sent (see the module's note)."""

    def __init__(self, sock: zmq.Socket, budget: int | None = None):
        self.sock = sock
        self.budget = SUBSCRIBER_BYTES if budget is None else budget
        self.mean = float(MIN_SIZE)
        self.hwm = self.mark(self.mean)
        self.changes = 0  # how often the socket's mark was set (a cost: one command per pipe)
        sock.setsockopt(zmq.SNDHWM, self.hwm)

    def mark(self, mean: float) -> int:
        return max(MIN_HWM, min(HWM, int(self.budget // max(mean, MIN_SIZE))))

    def before_send(self, size: int) -> None:
        self.mean += (size - self.mean) / MEAN_WINDOW
        hwm = self.mark(self.mean)
        if 2 * hwm <= self.hwm or hwm >= 2 * self.hwm or (hwm == HWM) != (self.hwm == HWM):
            self.hwm = hwm
            self.changes += 1
            self.sock.setsockopt(zmq.SNDHWM, hwm)


class Server:
    def __init__(
        self,
        control: str,
        bus_in: str,
        bus_out: str,
        curve: CurveKeys | None = None,
        guard_bus: str | None = None,
    ):
        """`guard_bus`: an extra ipc:// XSUB for the guards' hints, when bus_in is a CURVE tcp://
        endpoint (a guard has no keys); its messages are read exactly like bus_in's."""
        for name, endpoint in (("control", control), ("bus_in", bus_in), ("bus_out", bus_out)):
            check_endpoint(name, endpoint, curve)
        self.endpoints = {"control": control, "bus_in": bus_in, "bus_out": bus_out}
        self.guard_bus = guard_bus
        self.curve = curve
        self.secured = {
            name for name, endpoint in self.endpoints.items() if endpoint.startswith("tcp://")
        }
        self.allowed_clients = frozenset(
            z85.decode(key.encode()) for key in (curve["client_keys"] if curve else ())
        )
        self.zap: zmq.asyncio.Socket | None = None
        self.refused_clients: set[bytes] = set()
        self.ctx = zmq.asyncio.Context()
        self.counters = Counters()
        # Called with every event published, as published (history, metrics): must be cheap.
        self.observers: list[Callable[[str, dict], None]] = []
        self.rejected_bus_messages = 0
        self._tasks: list[asyncio.Task] = []
        self._answering: set[asyncio.Task] = set()

    def bind(self) -> None:
        ctx = self.ctx
        if self.secured:
            # Before any endpoint: a CURVE handshake must never find no ZAP handler (it would pass).
            self.zap = ctx.socket(zmq.REP)
            self.zap.setsockopt(zmq.LINGER, 0)
            self.zap.bind(ZAP_ENDPOINT)
        self.control = ctx.socket(zmq.ROUTER)
        self.bus_in = ctx.socket(zmq.XSUB)
        self.bus_out = ctx.socket(zmq.XPUB)
        for sock, name in (
            (self.control, "control"),
            (self.bus_in, "bus_in"),
            (self.bus_out, "bus_out"),
        ):
            sock.setsockopt(zmq.LINGER, 500)
            sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE)
            if name in self.secured and self.curve is not None:  # check_endpoint: it is there
                sock.curve_secretkey = self.curve["secret_key"].encode()
                sock.curve_publickey = self.curve["public_key"].encode()
                sock.curve_server = True
                sock.zap_domain = ZAP_DOMAIN
                try:
                    sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
                except (AttributeError, zmq.ZMQError):
                    pass  # an older libzmq: the ZAP socket bound above is what keeps it closed
        self.control.setsockopt(zmq.ROUTER_MANDATORY, 0)
        self.bus_in.setsockopt(zmq.RCVHWM, HWM)
        self.bus_out_hwm = HwmByBytes(self.bus_out)
        self.bus_out.setsockopt(zmq.XPUB_VERBOSE, 1)
        for sock, name in (
            (self.control, "control"),
            (self.bus_in, "bus_in"),
            (self.bus_out, "bus_out"),
        ):
            _bind(sock, f"endpoints.{name}", self.endpoints[name])
        self.bus_in.send(b"\x01")  # subscribe to everything published on bus-in
        self.guard_in = None
        if self.guard_bus:
            self.guard_in = ctx.socket(zmq.XSUB)
            self.guard_in.setsockopt(zmq.LINGER, 0)
            self.guard_in.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE)
            _bind(self.guard_in, "the guard bus", self.guard_bus)
            self.guard_in.send(b"\x01")

    def start(
        self, on_request: RequestHandler, on_bus: BusHandler, on_bad_bus: BadBusHandler
    ) -> None:
        self._on_request = on_request
        self._on_bus = on_bus
        self._on_bad_bus = on_bad_bus
        self._tasks = [
            asyncio.create_task(self._serve_control(), name="control"),
            asyncio.create_task(self._serve_bus_in(self.bus_in), name="bus-in"),
            asyncio.create_task(self._serve_subscriptions(), name="bus-out"),
        ]
        if self.guard_in is not None:
            self._tasks.append(
                asyncio.create_task(self._serve_bus_in(self.guard_in), name="guard-bus")
            )
        if self.zap is not None:
            self._tasks.append(asyncio.create_task(self._serve_zap(), name="zap"))

    async def _serve_zap(self) -> None:
        """Answer libzmq's ZAP requests for the tcp:// sockets' CURVE handshakes."""
        zap = self.zap
        assert zap is not None  # served only when bound
        while True:
            frames = await zap.recv_multipart()
            try:
                reply, refused = zap_answer(frames, self.allowed_clients)
            except (
                Exception
            ):  # a bug must refuse one handshake, never stop answering (REP needs a reply)
                log.exception("bug while answering a ZAP request")
                reply, refused = (
                    [
                        b"1.0",
                        frames[1] if len(frames) > 1 else b"",
                        b"500",
                        b"internal error",
                        b"",
                        b"",
                    ],
                    None,
                )
            await zap.send_multipart(reply)
            if refused is not None and refused not in self.refused_clients:
                if len(self.refused_clients) < MAX_LOGGED_REFUSALS:
                    self.refused_clients.add(refused)
                    address = frames[3].decode(errors="replace") if len(frames) > 3 else "?"
                    log.warning(
                        "refused a CURVE client from %s: its key %s is not in endpoints.curve.client_keys",
                        address,
                        z85.encode(refused).decode(),
                    )

    @property
    def seq(self) -> int:
        return self.counters.seq

    @property
    def epoch(self) -> str:
        """This supervisor run's epoch, on every event it publishes (see the module note)."""
        return self.counters.epoch

    def publish(self, topic: str, fields: dict) -> None:
        """Publish one of the supervisor's own events, with its counters (see `Counters`)."""
        counters, ended = self.counters.stamp(topic, fields)
        body = protocol.event_body(
            fields, seq=self.counters.seq, counters=counters, epoch=self.counters.epoch
        )
        frames = [topic.encode(), protocol.dumps(body)]
        self.bus_out_hwm.before_send(len(frames[0]) + len(frames[1]))
        if not _send_nowait(self.bus_out, frames):
            log.warning("bus-out is full: dropped %s (seq %d)", topic, self.counters.seq)
        for observe in self.observers:
            observe(topic, body)
        if ended is not None:
            self.publish(protocol.TURN_ENDED, ended)

    async def _serve_control(self) -> None:
        while True:
            frames = await self.control.recv_multipart(copy=True)
            task = asyncio.create_task(self._answer(frames))
            # The loop holds tasks weakly: keep each until it is done, or it may vanish unanswered.
            self._answering.add(task)
            task.add_done_callback(self._answering.discard)

    async def _answer(self, frames: list[bytes]) -> None:
        identity, rest = frames[0], frames[1:]
        envelope = [identity]
        if rest and rest[0] == b"":  # a REQ peer: keep its delimiter
            envelope.append(b"")
            rest = rest[1:]
        req_id = None
        try:
            if len(rest) != 1:
                raise protocol.ProtocolError(
                    "bad_request", f"a request is one frame, not {len(rest)}"
                )
            try:
                request = protocol.decode_request(rest[0])
            except protocol.ProtocolError as e:
                req_id = getattr(e, "request_id", None)
                raise
            req_id = request.id
            reply = protocol.encode_ok(req_id, await self._on_request(request))
        except protocol.ProtocolError as e:
            reply = protocol.encode_error(req_id, e.code, e.message)
        except Exception as e:  # a bug must cost one request an error reply, never the supervisor
            log.exception("bug while answering a control request")
            message = f"internal error: {type(e).__name__}; see the log"
            try:
                reply = protocol.encode_error(req_id, "failed", message)
            except Exception:  # noqa: BLE001 -- the id itself may be what cannot be encoded
                reply = protocol.encode_error(None, "failed", message)
        try:
            # A long reply (a big `ps`) goes in frames of at most MAX_FRAME (protocol's note).
            await self.control.send_multipart(envelope + protocol.reply_frames(reply))
        except zmq.ZMQError as e:
            log.warning("unable to send a control reply: %s", e)

    async def _serve_bus_in(self, sock) -> None:
        taken = 0
        while True:
            frames = await sock.recv_multipart()
            taken += 1
            if taken % BUS_IN_BATCH == 0:
                # A recv with messages queued completes without yielding: after a batch, let the
                # rest of the loop (control requests, pidfds) run (a big turn's guard sends a hint
                # per group, hundreds at once).
                await asyncio.sleep(0)
            try:
                self._take_bus_message(frames)
            except Exception:  # a bug must cost one message, never the bus
                self.rejected_bus_messages += 1
                log.exception("bug while handling a bus message")

    def _take_bus_message(self, frames: list[bytes]) -> None:
        try:
            topic, body = protocol.decode_event(frames)
        except protocol.ProtocolError as e:
            self.rejected_bus_messages += 1
            topic = frames[0][:128].decode(errors="replace") if frames else ""
            self._on_bad_bus(topic, None, e.message)
            return
        if topic.startswith(RESERVED_TOPICS):
            self.rejected_bus_messages += 1
            log.warning(
                "dropped a %s message published by someone else: only the supervisor speaks it",
                topic[:128],
            )
            return
        self.bus_out_hwm.before_send(sum(len(frame) for frame in frames))
        if not _send_nowait(self.bus_out, frames):
            log.warning("bus-out is full: dropped a forwarded %s", topic[:128])
        self._on_bus(topic, body)

    async def _serve_subscriptions(self) -> None:
        while True:
            frame = await self.bus_out.recv()
            if frame[:1] == b"\x01" and frame[1:].startswith(HELLO.encode()):
                _send_nowait(
                    self.bus_out, protocol.encode_event(frame[1:].decode(errors="replace"), {})
                )

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for name in (
            "control",
            "bus_in",
            "bus_out",
            "guard_in",
            "zap",
        ):  # zap last: it guards the others
            sock = getattr(self, name, None)
            if isinstance(sock, zmq.Socket):
                sock.close(linger=200)
        self.ctx.term()
        for endpoint in [*self.endpoints.values(), self.guard_bus or ""]:
            path = ipc_path(endpoint)
            if path is not None:
                try:
                    os.unlink(path)
                except OSError:
                    pass
