"""A small synchronous client of one supervisor: control requests, bus subscriptions, turns.

The CLI is built on it, and a Python sidecar needs a few lines:

    with Client(state_dir) as client:
        for topic, body in client.run_turn("codex", ["codex", "exec", "..."]):
            ...

Design note. "Is a supervisor running?" is answered before any request, without touching the
daemon (supervisor.instance: its lock, looked up without being taken). A missing ipc control
socket also means nothing runs. A request that gets no answer within the timeout is then either
NotRunning (the lock is free now) or a plain failure "did not answer" (the lock is held: the
daemon is there but stuck).

Control replies are matched by request id: a late reply to an earlier, timed-out request is
dropped, and the DEALER is replaced after a timeout so that nothing stale stays queued on it.

A bus subscription (supervisor.client.subscription) is live before `subscribe` returns it; a narrow one
(a turn's topics) sees every loss by the family counters. `TurnOutput` (supervisor.client.turn_output,
re-exported by the package for sidecars) reassembles a turn's output exactly from its events.

Client keys on tcp://. A supervisor with tcp:// endpoints lets in only the CURVE clients whose
public keys its `[endpoints.curve] client_keys` lists, so a client brings its own key pair: the
`client_secret_key` argument, else $CCSUP_CLIENT_SECRET_KEY, else the config's
`[endpoints.curve] client_secret_key` (what `ccsup` on the supervisor's machine uses). Only the
secret key is given; its public key is computed from it, so the two can never disagree. The
environment wins over the file, as for the state directory, so a sidecar or another user can
have a key of its own with the same config. With none of them, a tcp:// request fails at once
naming the three places, rather than waiting for a handshake the supervisor would refuse.

Knows zmq sockets, the protocol's envelope and the state directory's endpoints; nothing of slots
or processes. State: none on disk. Each Client owns its sockets and, unless given one, a zmq
context, closed with a short linger; it is not thread-safe (one per thread at a time). Clients
may share one Context (`context`), as the MCP server's calls do: one I/O thread for them all.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import zmq

from ..errors import CcsupError, ConfigError, NotRunning, UsageError, exit_code_for
from ..instance import lock_held, not_running_message
from ..paths import StatePaths, ipc_path
from ..wire import protocol

if TYPE_CHECKING:
    from ..config import CurveKeys, Endpoints
    from .subscription import Loss, Subscription

LINGER_MS = 100
CLIENT_KEY_ENV = "CCSUP_CLIENT_SECRET_KEY"


class RemoteError(CcsupError):
    """The supervisor refused or failed a request: `code` is the protocol's error code."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.exit_code = exit_code_for(code)


# -- the client ------------------------------------------------------------------------------------


class Client:
    """One supervisor, found by its state directory (and its endpoints when they are not default).

    `endpoints` is a config's Endpoints (with .control, .bus_in, .bus_out, .curve) or None for the
    ipc:// sockets in the state directory. `timeout` bounds every control request.
    `client_secret_key` (Z85) is this client's CURVE secret key for tcp:// endpoints; by default
    $CCSUP_CLIENT_SECRET_KEY, else endpoints.curve["client_secret_key"] (see the module note).
    `context`: a zmq Context to share (its I/O thread) with other clients, which `close` leaves
    open; by default the client makes its own.
    """

    def __init__(
        self,
        state_dir: Path,
        *,
        endpoints: Endpoints | None = None,
        timeout: float = 5.0,
        client_secret_key: str | None = None,
        context: zmq.Context | None = None,
    ):
        self.state_dir = Path(state_dir)
        self.paths = StatePaths(self.state_dir)
        self.timeout = timeout
        # An endpoint not given is the state directory's default.
        self.control_endpoint = (endpoints and endpoints.control) or self.paths.endpoint("control")
        self.bus_in_endpoint = (endpoints and endpoints.bus_in) or self.paths.endpoint("bus-in")
        self.bus_out_endpoint = (endpoints and endpoints.bus_out) or self.paths.endpoint("bus-out")
        self._curve: CurveKeys | None = endpoints.curve if endpoints else None
        self._client_key: tuple[str, str] | None  # (secret key, where it came from)
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
        self._own_ctx = context is None
        self._ctx = zmq.Context() if context is None else context
        self._dealer: zmq.Socket | None = None

    # -- lifetime

    def close(self) -> None:
        if self._dealer is not None:
            self._dealer.close(linger=0)
            self._dealer = None
        if self._own_ctx:
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

    def drop_requests(self) -> None:
        """Forget the control connection (and any request queued on it): the next request
        connects afresh, as after a supervisor's restart."""
        if self._dealer is not None:
            self._dealer.close(linger=0)
            self._dealer = None

    # -- is it running

    def running(self) -> bool:
        """Whether a supervisor holds this state directory's lock (and its control socket exists)."""
        path = ipc_path(self.control_endpoint)
        if path is not None and not os.path.exists(path):
            return False  # checked first: it is cheaper than the lock
        return lock_held(self.paths.lock)

    def check_running(self) -> None:
        if not self.running():
            from ..config.last_start import start_command

            raise NotRunning(not_running_message(self.state_dir, start_command(self.state_dir)))

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
                reply = protocol.decode_reply_frames(frames)
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
        inherit_env: bool = False,
        stdin: str | None = None,
    ) -> dict:
        """Request a turn; answers {"id","state","position"}. Follow it with subscribe/run_turn.

        env: added to the supervisor's environment (a None value removes a variable). With
        inherit_env, the turn's environment is this process's (os.environ) with env applied
        instead: what `ccsup run` does; a library's default stays the explicit one, since a
        sidecar's own environment is seldom the one its turns should get. stdin: "pipe" (the
        default: fed by `send`), "null" or "tty" (a pseudo-terminal; `resize` sizes it)."""
        args = _turn_args(key, argv, id, cwd, env, holder, reservation, wait_timeout)
        return self.call("turn", **_with_env_and_stdin(args, inherit_env, stdin))

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
        return self.call("send", id=id, eof=eof, **protocol.send_data(data))

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

    def quit(self, *, drain: bool = False, handover: bool = False, force: bool = False) -> dict:
        """Stop the supervisor; `drain`: first let the running turns end, granting nothing new;
        `handover`: exit without ending a turn, for the next supervisor to adopt (`ccsup restart`);
        refused (`conflict`) while turns on a terminal run, which would end, unless `force`."""
        args = {
            name: True
            for name, on in (("drain", drain), ("handover", handover), ("force", force))
            if on
        }
        return self.call("quit", **args)

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
        from .subscription import Subscription  # here: `ccsup ps` and `status` subscribe to nothing

        sub = Subscription(sock, list(prefixes), on_gap=on_gap, on_loss=on_loss)
        try:
            sub.handshake(self.timeout if timeout is None else timeout)
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

        It rides through a supervisor's restart (supervisor.client.ride_through): when the
        supervisor dies, it waits up to the `adopt_within` its `status` gave (+ 5 s) for one to
        answer, resubscribes, and yields the lifecycle events it missed from the history (output
        events published meanwhile are not repeated: a TurnOutput with `fill` takes them from the
        logs by offset). A turn granted whose guard had not started at the crash is held for it:
        it sends the same request again (same id) and the turn runs there. When none came back in time: the end its guard recorded (`exited` and
        `released` marked `"inferred": true`), or, for a turn still queued, waiting on;
        SupervisorLost (exit code 71) when neither is known.
        """
        from .ride_through import IDLE, TurnRider
        from .subscription import TERMINAL, is_terminal

        turn_id = kw.pop("id", None) or uuid.uuid4().hex
        rider = TurnRider(self, turn_id)
        rider.ask_again = lambda: self.turn(key, argv, id=turn_id, **kw)  # held after a crash
        sub = self.subscribe([f"turn.{turn_id}."])
        try:
            sub.expect_turn(turn_id)
            answer, again = rider.ask_through()  # asked again when its supervisor died answering
            if again is not None:
                sub.close()
                sub = again
                # Ended before (answered so): its end is the history's. Else it runs now, and its
                # output and end come on this subscription, live before it was asked again.
                ended = isinstance(answer, dict) and answer.get("state") in TERMINAL
                for missed in rider.catch_up():
                    if is_terminal(missed[0]) and not ended:
                        continue
                    yield missed
                    if is_terminal(missed[0]):
                        return
            while True:
                event = sub.recv(IDLE)
                if event is None:
                    if not rider.gone():
                        continue
                    sub.close()
                    while True:  # a supervisor gone again before it took us: the next one
                        if rider.await_return() is None:
                            told, events = rider.on_file()
                            if told == "queued":
                                continue  # waits in queue.json: a supervisor will run it
                            if told == "ended":
                                yield from events
                                return
                            raise rider.lost()
                        if (again := rider.resubscribe()) is not None:
                            break
                    sub = again
                    for missed in rider.catch_up():
                        yield missed
                        if is_terminal(missed[0]):
                            return
                    continue
                if is_terminal(event[0]):
                    yield from rider.before_end()
                rider.saw(event[0])
                yield event
                if is_terminal(event[0]):
                    return
        finally:
            sub.close()
            rider.close()

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
            raise UsageError(f"unknown bus request {kind!r}; known: turn, reserve, cancel, pause")
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

    # -- admission: pause and resume a key (supervisor.admission.control) --------------------------------

    def turn_limited(self, key: str, argv: list[str], *, timeout: float | None, **kw: Any) -> dict:
        """`turn` with a runtime limit: stopped after `timeout` seconds of running (exited
        `reason: "timeout"`), or the key's max_runtime if that is smaller."""
        args = _turn_args(
            key,
            argv,
            kw.pop("id", None),
            kw.pop("cwd", None),
            kw.pop("env", None),
            kw.pop("holder", None),
            kw.pop("reservation", None),
            kw.pop("wait_timeout", None),
        )
        args = _with_env_and_stdin(args, kw.pop("inherit_env", False), kw.pop("stdin", None))
        winsize = kw.pop("winsize", None)  # [rows, cols] of a "tty" turn's terminal
        if winsize is not None:
            args["winsize"] = winsize
        if kw:
            raise TypeError(f"unexpected arguments: {sorted(kw)}")
        if timeout is not None:
            args["timeout"] = timeout
        return self.call("turn", **args)

    def pause(
        self,
        key: str,
        *,
        for_: float | None = None,
        until: float | None = None,
        reason: str | None = None,
        id: str | None = None,
    ) -> dict:
        """Pause KEY for `for_` seconds or until `until` (epoch seconds); a bare harness name
        pauses all its keys. Answers the key's pause: {"key","until","reason","by","since",
        "changed","capped","id"} (the end is capped at now + [slots] max_pause)."""
        return self.call("pause", **_pause_args(key, for_, until, reason, id))

    def resume(self, key: str, *, reason: str | None = None) -> dict:
        """End KEY's pause now (a bare harness name: its keys' too). Answers {"key","resumed",
        "still_paused"} (a key stays paused while its harness is)."""
        return self.call("resume", key=key, **({} if reason is None else {"reason": reason}))

    def publish_pause(
        self,
        key: str,
        *,
        id: str,
        for_: float | None = None,
        until: float | None = None,
        reason: str | None = None,
    ) -> dict:
        """Publish `request.pause` on the bus (as a sidecar that saw a 429 does), re-sent (it is
        idempotent by id) until the supervisor's answer for this id, `key.<key>.paused`, arrives;
        returns that event's body. Another client's pause of the key is not taken for ours."""
        body = _pause_args(key, for_, until, reason, id)
        frames = [
            b"request.pause",
            protocol.dumps({"v": protocol.VERSION, "ts": time.time(), **body}),
        ]
        with self.subscribe([f"key.{key}.paused"]) as sub:
            pub = self._socket(zmq.PUB, self.bus_in_endpoint)
            try:
                deadline = time.monotonic() + self.timeout
                interval = 0.02
                while time.monotonic() < deadline:
                    pub.send_multipart(frames)
                    until_next = time.monotonic() + interval
                    while (left := until_next - time.monotonic()) > 0:
                        event = sub.recv(left)
                        if event is not None and event[1].get("id") == id:
                            return event[1]
                    interval = min(interval * 2, 0.5)
            finally:
                pub.close()
        self.check_running()
        raise CcsupError(f"no event answered request.pause {id!r} on {self.state_dir}")


def _pause_args(key, for_, until, reason, id) -> dict:
    args: dict[str, Any] = {"key": key}
    for name, value in (("for", for_), ("until", until), ("reason", reason), ("id", id)):
        if value is not None:
            args[name] = value
    return args


def _with_env_and_stdin(args: dict, inherit_env: bool, stdin: str | None) -> dict:
    """A turn's arguments with the caller's environment (inherit_env: os.environ with `env`
    applied, sent whole as `env_replace`) and its stdin mode, when asked."""
    if inherit_env:
        given = args.get("env") or {}
        whole = {**os.environ, **{k: v for k, v in given.items() if v is not None}}
        for name in [k for k, v in given.items() if v is None]:
            whole.pop(name, None)
        args["env"], args["env_replace"] = whole, True
    if stdin is not None:
        args["stdin"] = stdin
    return args


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
