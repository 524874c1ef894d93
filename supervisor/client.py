"""A small synchronous client of one supervisor: control requests, bus subscriptions, turns.

The CLI is built on it, and a Python sidecar needs a few lines:

    with Client(state_dir) as client:
        for topic, body in client.run_turn("codex", ["codex", "exec", "..."]):
            ...

Design note. "Is a supervisor running?" is answered before any request, without touching the
daemon: its lock (<state>/supervisor.lock) is looked up in /proc/locks by inode. Taking the lock,
even for a moment with LOCK_NB, would make a daemon starting at that instant see it taken and exit
"already running" (`ccsup start` polls `status` exactly while its daemon starts); a flock probe is
the fallback only where /proc/locks cannot be read. The first read of /proc/locks in a process
waits for the kernel to take its global file-lock semaphore for writing (an RCU grace period,
about 10 ms here, and every flock on the machine waits with it), so the daemon's own answer is
tried first: the lock file holds its pid, and /proc/<pid>/fdinfo of the descriptor open on the
lock file lists the flock it holds. Only when that does not show the lock held is /proc/locks
read. A missing ipc control socket also means
nothing runs. A request that gets no answer within the timeout is then either NotRunning (the lock
is free now) or a plain failure "did not answer" (the lock is held: the daemon is there but stuck).

Control replies are matched by request id: a late reply to an earlier, timed-out request is
dropped, and the DEALER is replaced after a timeout so that nothing stale stays queued on it.

A bus subscription is live only once the supervisor has seen it; the client subscribes to its
topics and to a unique `ccsup.hello.<nonce>` topic, and returns once the supervisor's answer on
that topic arrives (re-subscribing every 0.5 s, as the XPUB only answers a new subscription).
Every supervisor event carries `seq`; a subscription to everything ("") counts the holes in it
(`gaps`, and `on_gap`), so a caller can catch up with `ps`. A filtered subscription sees holes in
`seq` by design, so it checks the family counters instead (see supervisor.server): a subscription
to a turn's topics also subscribes to the low-volume `supervisor.` family (its events are used, not
yielded, unless asked for), and counts a hole in a turn's `turn_seq`, in `supervisor_seq`, or a
`supervisor.turn_ended` past the last `turn_seq` it saw (`gaps`, and `on_loss` with a `Loss`).
A turn whose terminal event was lost then gets an inferred one (`"inferred": true`, its state from
`turn_ended`), so `until_terminal` always ends. Contiguity is checked from the first event seen of
a turn, or from its first event for a turn followed from its request (`expect_turn`, run_turn).

Client keys on tcp://. A supervisor with tcp:// endpoints lets in only the CURVE clients whose
public keys its `[endpoints.curve] client_keys` lists, so a client brings its own key pair: the
`client_secret_key` argument, else $CCSUP_CLIENT_SECRET_KEY, else the config's
`[endpoints.curve] client_secret_key` (what `ccsup` on the supervisor's machine uses). Only the
secret key is given; its public key is computed from it, so the two can never disagree. The
environment wins over the file, as for the state directory, so a sidecar or another user can
have a key of its own with the same config. With none of them, a tcp:// request fails at once
naming the three places, rather than waiting for a handshake the supervisor would refuse.

State: none on disk. Each Client owns one zmq context and its sockets, closed with a short linger;
it is not thread-safe (one per thread).
"""

from __future__ import annotations

import base64
import errno
import fcntl
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import zmq

from . import protocol
from .errors import CcsupError, ConfigError, NotRunning, UsageError
from .paths import StatePaths

LINGER_MS = 100
HELLO_PREFIX = "ccsup.hello."
HELLO_RETRY = 0.5
TERMINAL = protocol.TERMINAL_EVENTS
SUPERVISOR_PREFIX = "supervisor."
CLIENT_KEY_ENV = "CCSUP_CLIENT_SECRET_KEY"
# Reply codes that mean the request itself was wrong (the CLI exits 2 for them).
_USAGE_CODES = ("bad_request", "too_large", "unknown_command", "unsupported_version")


class RemoteError(CcsupError):
    """The supervisor refused or failed a request: `code` is the protocol's error code."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.exit_code = 2 if code in _USAGE_CODES else 1


class Loss(NamedTuple):
    """Events a subscription knows it missed: counter values first..last."""

    counter: str  # "seq", "turn_seq" or "supervisor_seq"
    turn: str | None  # the turn, for turn_seq
    first: int
    last: int


def is_terminal(topic: str) -> bool:
    return topic.startswith("turn.") and topic.rsplit(".", 1)[-1] in TERMINAL


def not_running_message(state_dir: Path) -> str:
    return f"no supervisor is running on {state_dir}; start one with `ccsup start`"


# -- is a supervisor there? ------------------------------------------------------------------------


def _held_in_proc_locks(st: os.stat_result) -> bool | None:
    """Whether /proc/locks lists a lock on this inode; None when /proc/locks cannot be read."""
    try:
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    want = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    for line in lines:
        # "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF"; blocked waiters have a "->" field.
        fields = line.split()
        if "->" in fields:
            continue
        for field in fields:
            parts = field.split(":")
            if len(parts) == 3:
                try:
                    found = (int(parts[0], 16), int(parts[1], 16), int(parts[2]))
                except ValueError:
                    continue
                if found == want:
                    return True
                break
    return False


def _held_by_recorded_pid(fd: int, st: os.stat_result) -> bool:
    """Whether the process whose pid the lock file records holds a flock on it, by its fdinfo.

    False when that cannot be shown (no pid, a process gone or not ours, no such lock): not a
    "no", only "ask /proc/locks".
    """
    try:
        pid = int(os.pread(fd, 32, 0).decode("ascii").strip())
        fd_dir = f"/proc/{pid}/fd"
        names = os.listdir(fd_dir)
    except (OSError, ValueError):
        return False
    for name in names:
        try:
            target = os.stat(f"{fd_dir}/{name}")
            if (target.st_dev, target.st_ino) != (st.st_dev, st.st_ino):
                continue
            with open(f"/proc/{pid}/fdinfo/{name}") as f:
                info = f.read()
        except OSError:
            continue
        # "lock:\t1: FLOCK  ADVISORY  WRITE 1234 fe:00:5678 0 EOF", for locks held through this fd
        if any(
            line.startswith("lock:") and " FLOCK " in line and "->" not in line
            for line in info.splitlines()
        ):
            return True
    return False


def lock_held(lock_path: Path) -> bool:
    """Whether some process holds the flock on lock_path (a missing file is not held)."""
    try:
        fd = os.open(lock_path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError as e:
        raise CcsupError(f"unable to open supervisor lock {lock_path}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if _held_by_recorded_pid(fd, st):
            return True
        held = _held_in_proc_locks(st)
        if held is not None:
            return held
        try:  # fallback probe: may, for an instant, look taken to a starting daemon
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return True
            raise CcsupError(f"unable to probe supervisor lock {lock_path}: {e.strerror}") from None
        return False
    finally:
        os.close(fd)


def _ipc_path(endpoint: str) -> Path | None:
    return Path(endpoint[len("ipc://") :]) if endpoint.startswith("ipc://") else None


# -- the client ------------------------------------------------------------------------------------


class Client:
    """One supervisor, found by its state directory (and its endpoints when they are not default).

    `endpoints` is a config's Endpoints (with .control, .bus_in, .bus_out, .curve) or None for the
    ipc:// sockets in the state directory. `timeout` bounds every control request.
    `client_secret_key` (Z85) is this client's CURVE secret key for tcp:// endpoints; by default
    $CCSUP_CLIENT_SECRET_KEY, else endpoints.curve["client_secret_key"] (see the module note).
    """

    def __init__(
        self,
        state_dir: Path,
        *,
        endpoints: Any = None,
        timeout: float = 5.0,
        client_secret_key: str | None = None,
    ):
        self.state_dir = Path(state_dir)
        self.paths = StatePaths(self.state_dir)
        self.timeout = timeout
        if endpoints is None:
            self.control_endpoint = self.paths.endpoint("control")
            self.bus_in_endpoint = self.paths.endpoint("bus-in")
            self.bus_out_endpoint = self.paths.endpoint("bus-out")
            self._curve = None
        else:
            self.control_endpoint = endpoints.control
            self.bus_in_endpoint = endpoints.bus_in
            self.bus_out_endpoint = endpoints.bus_out
            self._curve = getattr(endpoints, "curve", None)
        if client_secret_key is not None:
            self._client_key = (client_secret_key, "the client_secret_key argument")
        elif os.environ.get(CLIENT_KEY_ENV):
            self._client_key = (os.environ[CLIENT_KEY_ENV], f"${CLIENT_KEY_ENV}")
        elif self._curve and self._curve.get("client_secret_key"):
            self._client_key = (
                self._curve["client_secret_key"],
                "endpoints.curve.client_secret_key",
            )
        else:
            self._client_key = None
        self._ctx = zmq.Context()
        self._dealer: zmq.Socket | None = None

    # -- lifetime

    def close(self) -> None:
        if self._dealer is not None:
            self._dealer.close(linger=0)
            self._dealer = None
        self._ctx.destroy(linger=LINGER_MS)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _socket(self, kind: int, endpoint: str) -> zmq.Socket:
        sock = self._ctx.socket(kind)
        sock.linger = LINGER_MS
        try:
            if self._curve and endpoint.startswith("tcp://"):
                sock.curve_publickey, sock.curve_secretkey = self._client_pair(endpoint)
                sock.curve_serverkey = self._curve["public_key"].encode()
            sock.connect(endpoint)
        except BaseException:
            sock.close(linger=0)
            raise
        return sock

    def _client_pair(self, endpoint: str) -> tuple[bytes, bytes]:
        """This client's CURVE (public, secret) key pair for a tcp:// endpoint."""
        if self._client_key is None:
            raise ConfigError(
                f"unable to connect to {endpoint}: no CURVE client key; set ${CLIENT_KEY_ENV} or "
                "[endpoints.curve] client_secret_key (its public key must be in the supervisor's client_keys)"
            )
        secret, where = self._client_key
        try:
            return zmq.curve_public(secret.encode()), secret.encode()
        except (ValueError, zmq.ZMQError):
            raise ConfigError(
                f"unable to connect to {endpoint}: {where} is not a CURVE secret key "
                f"(40 Z85 characters)"
            ) from None

    # -- is it running

    def running(self) -> bool:
        """Whether a supervisor holds this state directory's lock (and its control socket exists)."""
        path = _ipc_path(self.control_endpoint)
        if path is not None and not path.exists():
            return False  # checked first: it is cheaper than the lock
        return lock_held(self.paths.lock)

    def check_running(self) -> None:
        if not self.running():
            raise NotRunning(not_running_message(self.state_dir))

    # -- control

    def call(self, cmd: str, **args: Any) -> dict:
        """Send one control request and return its result; RemoteError for an error reply."""
        self.check_running()
        if self._dealer is None:
            self._dealer = self._socket(zmq.DEALER, self.control_endpoint)
        req_id = uuid.uuid4().hex
        self._dealer.send(protocol.encode_request(req_id, cmd, args))
        deadline = time.monotonic() + self.timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self._dealer.poll(int(left * 1000) + 1, zmq.POLLIN):
                if time.monotonic() < deadline:
                    continue
                self._dealer.close(linger=0)  # drop the unanswered request with its socket
                self._dealer = None
                self.check_running()
                raise CcsupError(
                    f"the supervisor on {self.state_dir} did not answer {cmd!r} within {self.timeout:g} s"
                )
            frames = self._dealer.recv_multipart()
            try:
                reply = protocol.decode_reply(frames[-1])
            except protocol.ProtocolError as e:
                raise CcsupError(
                    f"unable to read the supervisor's reply to {cmd!r}: {e.message}"
                ) from None
            if reply.get("id") != req_id:
                continue  # a late answer to an earlier request
            if reply["ok"]:
                result = reply.get("result")
                return result if isinstance(result, dict) else {}
            error = reply.get("error") or {}
            raise RemoteError(
                str(error.get("code", "failed")), str(error.get("message", "(no message)"))
            )

    def status(self) -> dict:
        return self.call("status")

    def ps(self) -> dict:
        return self.call("ps")

    def turn(
        self,
        key: str,
        argv: list[str],
        *,
        id: str | None = None,
        cwd: str | None = None,
        env: dict | None = None,
        holder: dict | None = None,
        reservation: str | None = None,
        wait_timeout: float | None = None,
    ) -> dict:
        """Request a turn; answers {"id","state","position"}. Follow it with subscribe/run_turn."""
        return self.call(
            "turn", **_turn_args(key, argv, id, cwd, env, holder, reservation, wait_timeout)
        )

    def reserve(
        self,
        key: str,
        *,
        holder: dict | None = None,
        id: str | None = None,
        wait_timeout: float | None = None,
    ) -> dict:
        args: dict[str, Any] = {"key": key, "holder": holder or {}}
        if id is not None:
            args["id"] = id
        if wait_timeout is not None:
            args["wait_timeout"] = wait_timeout
        return self.call("reserve", **args)

    def cancel(self, id: str) -> dict:
        return self.call("cancel", id=id)

    def send(self, id: str, data: str | bytes, eof: bool = False) -> dict:
        """Write to a turn's stdin: text as UTF-8, bytes exactly (as 'data_b64' unless UTF-8)."""
        return self.call("send", id=id, eof=eof, **send_data(data))

    def read_log(self, turn_id: str, stream: str, start: int = 0, end: int | None = None) -> bytes:
        """Bytes [start, end) of a turn's output log on this machine (a TurnOutput `fill`)."""
        path = self.paths.output_log(turn_id, stream)
        try:
            with open(path, "rb") as f:
                f.seek(start)
                return f.read(-1 if end is None else max(0, end - start))
        except OSError as e:
            raise CcsupError(f"unable to read {path}: {e.strerror}") from None

    def reap(self, key: str | None = None) -> dict:
        return self.call("reap", **({} if key is None else {"key": key}))

    def reload(self) -> dict:
        return self.call("reload")

    def quit(self) -> dict:
        return self.call("quit")

    # -- bus

    def subscribe(
        self,
        prefixes: list[str] | str,
        *,
        timeout: float | None = None,
        on_gap: Callable[[int, int], None] | None = None,
        on_loss: Callable[[Loss], None] | None = None,
    ) -> Subscription:
        """A live subscription to these topic prefixes ("" for everything)."""
        if isinstance(prefixes, str):
            prefixes = [prefixes]
        self.check_running()
        sock = self._socket(zmq.SUB, self.bus_out_endpoint)
        sock.rcvhwm = 0  # a slow reader queues rather than loses; seq still reveals any loss
        sub = Subscription(sock, list(prefixes), on_gap=on_gap, on_loss=on_loss)
        try:
            sub._handshake(self.timeout if timeout is None else timeout)
        except BaseException:
            sub.close()
            raise
        if not sub.live:
            sub.close()
            self.check_running()
            raise CcsupError(
                f"the supervisor on {self.state_dir} did not answer a bus subscription"
            )
        return sub

    def run_turn(self, key: str, argv: list[str], **kw: Any) -> Iterator[tuple[str, dict]]:
        """Request a turn and yield its events (topic, body) up to and including the terminal one.

        The subscription is made (and live) before the request, so no event is missed. The turn id
        is made here unless given; it is `body["id"]` of every event.
        """
        turn_id = kw.pop("id", None) or uuid.uuid4().hex
        with self.subscribe([f"turn.{turn_id}."]) as sub:
            sub.expect_turn(turn_id)
            self.turn(key, argv, id=turn_id, **kw)
            yield from sub.until_terminal(idle_check=self.check_running)

    def publish_request(
        self, kind: str, body: dict, *, prefix: str | None = None, timeout: float | None = None
    ) -> Subscription:
        """Publish `request.<kind>` on the bus and return a subscription to its events.

        A fresh PUB drops what it sends before its connection is up, so the request is re-sent
        (requests are idempotent by id) until the first event for it arrives; that event is the
        first the returned subscription yields. `prefix` defaults to `turn.<id>.`.
        """
        topic = f"request.{kind}"
        if topic not in protocol.REQUEST_TOPICS:
            raise UsageError(f"unknown bus request {kind!r}; known: turn, reserve, cancel")
        if not isinstance(body.get("id"), str):
            raise UsageError("a bus request carries a client-made 'id' (a string)")
        sub = self.subscribe([prefix or f"turn.{body['id']}."], timeout=timeout)
        pub = self._socket(zmq.PUB, self.bus_in_endpoint)
        try:
            deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
            frames = [
                topic.encode(),
                protocol.dumps({"v": protocol.VERSION, "ts": time.time(), **body}),
            ]
            interval = 0.02
            while True:
                pub.send_multipart(frames)
                if sub.peek(interval):
                    return sub
                if time.monotonic() > deadline:
                    sub.close()
                    self.check_running()
                    raise CcsupError(
                        f"no event answered {topic} {body['id']!r} on {self.state_dir}"
                    )
                interval = min(interval * 2, 0.5)
        except BaseException:
            sub.close()
            raise
        finally:
            pub.close()


def send_data(data: str | bytes) -> dict[str, str]:
    """The data field of a send request: 'data' for text (and UTF-8 bytes), else 'data_b64'."""
    if isinstance(data, str):
        return {"data": data}
    try:
        return {"data": data.decode()}
    except UnicodeDecodeError:
        return {"data_b64": base64.b64encode(data).decode("ascii")}


class OutputGap(CcsupError):
    """Output events were lost: `stream` bytes [expected, got) never arrived."""

    def __init__(self, turn_id: str, stream: str, expected: int, got: int):
        super().__init__(
            f"turn {turn_id}: {stream} bytes {expected} to {got} were lost on the bus; they are "
            f"in its {stream}.log (Client.read_log)"
        )
        self.stream = stream
        self.expected = expected
        self.got = got


class TurnOutput:
    """Reassembles a turn's stdout and stderr from its events, exactly: the sidecar's helper.

        out = TurnOutput(turn_id, fill=partial(client.read_log, turn_id))
        for topic, body in client.run_turn(...):
            got = out.feed(topic, body)   # (stream, exact bytes) or None
    `feed` returns an output event's exact bytes (text events are UTF-8, `data_b64` ones are
    decoded) in stream order; any other event gives None. Offsets tile each stream, so a chunk
    that starts past `position[stream]` means events were lost: `fill(stream, start, end)`
    supplies the missing bytes when given, else OutputGap is raised. A chunk already seen is
    ignored (only its new part counts).
    """

    def __init__(self, turn_id: str, fill: Callable[[str, int, int], bytes] | None = None):
        self.turn_id = turn_id
        self.fill = fill
        self.position = {"stdout": 0, "stderr": 0}

    def feed(self, topic: str, body: dict) -> tuple[str, bytes] | None:
        stream = topic.rsplit(".", 1)[-1]
        if stream not in self.position or not topic.startswith(f"turn.{self.turn_id}."):
            return None
        offset, data = protocol.output_bytes(body)
        position = self.position[stream]
        if offset > position:
            if self.fill is None:
                raise OutputGap(self.turn_id, stream, position, offset)
            missing = self.fill(stream, position, offset)
            if len(missing) != offset - position:
                raise OutputGap(self.turn_id, stream, position + len(missing), offset)
            data = missing + data
        elif offset < position:
            data = data[position - offset :]
        self.position[stream] += len(data)
        return stream, data


def _turn_args(key, argv, id, cwd, env, holder, reservation, wait_timeout) -> dict:
    args: dict[str, Any] = {"key": key, "argv": list(argv)}
    for name, value in (
        ("id", id),
        ("cwd", cwd),
        ("env", env),
        ("holder", holder),
        ("reservation", reservation),
        ("wait_timeout", wait_timeout),
    ):
        if value is not None:
            args[name] = value
    return args


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
        self._turn_seq: dict[str, int] = {}  # turn id -> the last turn_seq seen
        self._turn_ended: set[str] = set()  # turns whose terminal event was seen
        self._supervisor_seq: int | None = None
        self._pending: list[tuple[str, dict]] = []
        for prefix in prefixes:
            sock.setsockopt(zmq.SUBSCRIBE, prefix.encode())
        # A narrow subscription to turn topics watches the low-volume supervisor family too.
        self._watching = not self._check_seq and any(p.startswith("turn.") for p in prefixes)
        if self._watching and not any(SUPERVISOR_PREFIX.startswith(p) for p in prefixes):
            sock.setsockopt(zmq.SUBSCRIBE, SUPERVISOR_PREFIX.encode())

    def expect_turn(self, turn_id: str) -> None:
        """This turn's events are all to come (the subscription is older than the turn)."""
        self._turn_seq.setdefault(turn_id, 0)

    def _wanted(self, topic: str) -> bool:
        return any(topic.startswith(p) for p in self.prefixes)

    def _lost(self, loss: Loss) -> None:
        self.gaps += loss.last - loss.first + 1
        if self.on_loss is not None:
            self.on_loss(loss)

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
        last = self._turn_seq.pop(turn_id, None)  # nothing more comes of it: forget it
        final = body.get("turn_seq")
        if turn_id in self._turn_ended:
            self._turn_ended.discard(turn_id)
            return  # its end was seen
        if last is None or type(final) is not int:
            return  # a turn this subscription does not follow
        if final > last:
            self._lost(Loss("turn_seq", turn_id, last + 1, final))
        state = body.get("state")
        if state in protocol.TERMINAL_EVENTS:
            inferred = {"id": turn_id, "key": body.get("key"), "inferred": True}
            self._pending.append((f"turn.{turn_id}.{state}", inferred))

    def _handshake(self, timeout: float) -> None:
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
