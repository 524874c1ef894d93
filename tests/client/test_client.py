"""supervisor.client against a fake supervisor: real ZeroMQ sockets and a real flock, in a thread.

The fake binds the same ipc:// endpoints a daemon binds and holds <state>/supervisor.lock, so
these tests pin the client's side of the protocol (id matching, error replies, the hello
handshake, seq gaps, bus requests re-sent until answered) without the daemon.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import zmq

from supervisor.client import Client, RemoteError
from supervisor.client.subscription import Loss
from supervisor.errors import CcsupError, NotRunning, SupervisorLost
from supervisor.instance import lock_held
from supervisor.wire import protocol

HELLO = b"ccsup.hello."


class FakeSupervisor:
    """Holds the lock, answers control requests with `handler(cmd, args) -> result | Exception`,
    publishes `events` on demand and answers hellos on the XPUB, like the real server."""

    def __init__(
        self, state_dir: Path, handler=None, *, answer_hello: bool = True, lock: bool = True
    ):
        self.state_dir = state_dir
        self.handler = handler or (lambda cmd, args: {"cmd": cmd, "args": args})
        self.answer_hello = answer_hello
        self.bus_requests: list[tuple[str, dict]] = []
        self.on_bus = lambda topic, body: None
        self.seq = 0
        self.ctx = zmq.Context()
        self.lock_fd = None
        if lock:
            self.lock_fd = os.open(state_dir / "supervisor.lock", os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(self.lock_fd, fcntl.LOCK_EX)
        self.control = self.ctx.socket(zmq.ROUTER)
        self.bus_in = self.ctx.socket(zmq.XSUB)
        self.bus_out = self.ctx.socket(zmq.XPUB)
        self.bus_out.setsockopt(zmq.XPUB_VERBOSE, 1)
        self.control.bind(f"ipc://{state_dir}/control")
        self.bus_in.bind(f"ipc://{state_dir}/bus-in")
        self.bus_out.bind(f"ipc://{state_dir}/bus-out")
        self.bus_in.send(b"\x01")
        self.outbox: list[tuple[str, dict, bool, int]] = []
        self._lock = threading.Lock()
        self._stop = False
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def publish(self, topic: str, fields: dict, *, seq: bool = True, skip: int = 0) -> None:
        """Queue an event; `skip` seq numbers are used up first (events "lost" on the way)."""
        with self._lock:
            self.outbox.append((topic, fields, seq, skip))

    def _loop(self) -> None:
        poller = zmq.Poller()
        for sock in (self.control, self.bus_in, self.bus_out):
            poller.register(sock, zmq.POLLIN)
        while not self._stop:
            ready = dict(poller.poll(10))
            if self.control in ready:
                frames = self.control.recv_multipart()
                request = protocol.decode_request(frames[-1])
                try:
                    outcome = self.handler(request.cmd, request.args)
                except protocol.ProtocolError as e:
                    reply = protocol.encode_error(request.id, e.code, e.message)
                else:
                    if outcome is None:
                        continue  # never answered
                    if isinstance(outcome, list):  # raw reply frames to send instead
                        for raw in outcome:
                            self.control.send_multipart([frames[0], raw])
                        continue
                    reply = protocol.encode_ok(request.id, outcome)
                self.control.send_multipart([frames[0], reply])
            if self.bus_in in ready:
                topic, body = protocol.decode_event(self.bus_in.recv_multipart())
                self.bus_requests.append((topic, body))
                self.on_bus(topic, body)
            if self.bus_out in ready:
                frame = self.bus_out.recv()
                if self.answer_hello and frame[:1] == b"\x01" and frame[1:].startswith(HELLO):
                    self.bus_out.send_multipart(protocol.encode_event(frame[1:].decode(), {}))
            with self._lock:
                outbox, self.outbox = self.outbox, []
            for topic, fields, with_seq, skip in outbox:
                self.seq += skip
                if with_seq:
                    self.seq += 1
                self.bus_out.send_multipart(
                    protocol.encode_event(topic, fields, seq=self.seq if with_seq else None)
                )

    def close(self) -> None:
        if self._stop:
            return
        self._stop = True
        self.thread.join(5)
        self.ctx.destroy(linger=0)
        if self.lock_fd is not None:
            os.close(self.lock_fd)
            self.lock_fd = None


@pytest.fixture
def fake(state_dir):
    made = []

    def make(*args, **kw):
        f = FakeSupervisor(state_dir, *args, **kw)
        made.append(f)
        return f

    yield make
    for f in made:
        f.close()


# -- is it running ---------------------------------------------------------------------------------


def test_not_running_without_lock_file_is_quick_and_clear(state_dir):
    with Client(state_dir, timeout=5) as client:
        t0 = time.monotonic()
        with pytest.raises(NotRunning) as info:
            client.status()
        assert time.monotonic() - t0 < 0.5
    assert info.value.exit_code == 3
    assert (
        info.value.message
        == f"no supervisor is running on {state_dir}; start one with `ccsup start`"
    )


def test_not_running_when_lock_file_is_free(state_dir):
    (state_dir / "supervisor.lock").write_text("")
    (state_dir / "control").write_text("")  # a stale socket file left by a killed daemon
    with Client(state_dir) as client, pytest.raises(NotRunning):
        client.ps()


def test_not_running_when_lock_held_but_control_socket_missing(state_dir, fake):
    fake()
    os.unlink(state_dir / "control")
    with Client(state_dir) as client, pytest.raises(NotRunning):
        client.status()


def test_lock_held_sees_another_process_holding_it(state_dir):
    lock = state_dir / "supervisor.lock"
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl,os,sys; fd=os.open(sys.argv[1], os.O_RDWR|os.O_CREAT); fcntl.flock(fd, fcntl.LOCK_EX);"
            "print('ready', flush=True); sys.stdin.read()",
            str(lock),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline() == "ready\n"
        assert lock_held(lock) is True
    finally:
        child.stdin.close()
        child.wait(5)
    assert lock_held(lock) is False


def test_lock_probe_never_takes_the_lock(state_dir):
    """A daemon starting while `ccsup start` probes must never find its lock taken by the probe."""
    lock = state_dir / "supervisor.lock"
    lock.write_text("")
    stop = threading.Event()
    probes = 0

    def probe():
        nonlocal probes
        while not stop.is_set():
            lock_held(lock)  # True now and then: the racer itself holds it for a moment
            probes += 1

    thread = threading.Thread(target=probe)
    thread.start()
    refused = 0
    try:
        # Until the probe has run 50 times at least (half a second on a quiet machine).
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and probes <= 50:
            fd = os.open(lock, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                refused += 1
            finally:
                os.close(fd)
    finally:
        stop.set()
        thread.join()
    assert probes > 50
    assert refused == 0


# -- control ---------------------------------------------------------------------------------------


def test_call_returns_result_and_passes_args(state_dir, fake):
    fake()
    with Client(state_dir) as client:
        assert client.call("status") == {"cmd": "status", "args": {}}
        assert client.turn("codex", ["true"], id="t1", wait_timeout=2.5) == {
            "cmd": "turn",
            "args": {"key": "codex", "argv": ["true"], "id": "t1", "wait_timeout": 2.5},
        }
        assert client.send("t1", "hi\n", eof=True)["args"] == {
            "id": "t1",
            "data": "hi\n",
            "eof": True,
        }
        assert client.reap()["args"] == {}
        assert client.reap("codex")["args"] == {"key": "codex"}


@pytest.mark.parametrize(
    "code, exit_code",
    [("bad_request", 2), ("unknown_command", 2), ("not_found", 1), ("stopping", 1), ("failed", 1)],
)
def test_error_reply_raises_remote_error_with_code(state_dir, fake, code, exit_code):
    def handler(cmd, args):
        raise protocol.ProtocolError(code, f"no good: {cmd}")

    fake(handler)
    with Client(state_dir) as client, pytest.raises(RemoteError) as info:
        client.cancel("abc")
    assert (info.value.code, info.value.exit_code, info.value.message) == (
        code,
        exit_code,
        "no good: cancel",
    )


def test_reply_with_another_id_is_ignored(state_dir, fake):
    def handler(cmd, args, _calls=[]):
        _calls.append(cmd)
        stale = protocol.encode_ok("someone-else", {"stale": True})
        return [stale] if len(_calls) == 1 else {"fresh": True}

    fake(handler)
    with Client(state_dir, timeout=0.3) as client:
        with pytest.raises(CcsupError) as info:
            client.status()  # only the stale reply comes: no answer within the timeout
        assert not isinstance(info.value, NotRunning)
        assert "did not answer 'status' within 0.3 s" in info.value.message
        assert client.status() == {"fresh": True}


def test_silent_supervisor_times_out_as_failure_not_not_running(state_dir, fake):
    fake(lambda cmd, args: None)
    with Client(state_dir, timeout=0.3) as client:
        t0 = time.monotonic()
        with pytest.raises(CcsupError) as info:
            client.ps()
        assert 0.3 <= time.monotonic() - t0 < 1.5
    assert type(info.value) is CcsupError and info.value.exit_code == 1


# -- bus -------------------------------------------------------------------------------------------


def test_subscribe_returns_live_and_filters_hellos(state_dir, fake):
    f = fake()
    with Client(state_dir) as client, client.subscribe(["turn.a."]) as sub:
        assert sub.live
        f.publish("ccsup.hello.someone-else", {}, seq=False)
        f.publish("turn.b.queued", {"id": "b"})
        f.publish("turn.a.queued", {"id": "a", "position": 1})
        topic, body = sub.recv(2)
        assert (topic, body["id"], body["position"], body["seq"]) == ("turn.a.queued", "a", 1, 2)
        assert sub.recv(0.1) is None


def test_subscribe_without_hello_answer_fails(state_dir, fake):
    fake(answer_hello=False)
    with Client(state_dir, timeout=0.6) as client, pytest.raises(CcsupError) as info:
        client.subscribe(["turn."])
    assert "did not answer a bus subscription" in info.value.message


def test_gap_in_seq_is_counted_on_a_full_subscription(state_dir, fake):
    f = fake()
    seen = []
    with Client(state_dir) as client:
        full = client.subscribe([""], on_gap=lambda first, got: seen.append((first, got)))
        part = client.subscribe(["x."])
        for topic in ("x.1", "y.2", "x.3"):
            f.publish(topic, {})
        f.publish("x.6", {}, skip=2)
        got = [full.recv(2)[0] for _ in range(4)]
        assert got == ["x.1", "y.2", "x.3", "x.6"]
        assert [part.recv(2)[0] for _ in range(3)] == ["x.1", "x.3", "x.6"]
        assert (full.gaps, seen) == (2, [(4, 6)])
        assert part.gaps == 0  # a filtered subscription sees holes by design
        full.close()
        part.close()


def test_run_turn_yields_events_until_terminal(state_dir, fake):
    f = None

    def handler(cmd, args):
        if cmd == "turn":
            t = args["id"]
            for kind, fields in [
                ("queued", {"position": 0}),
                ("granted", {"index": 0}),
                ("stdout", {"offset": 0, "data": "hi\n"}),
                ("exited", {"code": 0, "signal": None, "reason": None}),
                ("gone", {}),
                ("released", {}),
                ("released", {}),
            ]:
                f.publish(f"turn.{t}.{kind}", {"id": t, **fields})
            return {"id": t, "state": "queued", "position": 0}
        return {}

    f = fake(handler)
    with Client(state_dir) as client:
        events = list(client.run_turn("codex", ["echo", "hi"], id="turn1"))
    assert [t for t, _ in events] == [
        f"turn.turn1.{k}" for k in ("queued", "granted", "stdout", "exited", "gone", "released")
    ]
    assert {b["id"] for _, b in events} == {"turn1"}


def test_run_turn_ends_with_supervisor_lost_when_supervisor_goes_for_good(state_dir, fake):
    # It waits for a supervisor to come back (tests/client/test_ride_through.py), then gives up.
    f = fake(lambda cmd, args: {"id": args.get("id"), "state": "queued", "position": 0})
    with Client(state_dir) as client:
        events = client.run_turn("codex", ["true"])
        f.publish("ccsup.noise", {})
        threading.Timer(0.3, f.close).start()
        with pytest.raises(SupervisorLost):
            list(events)


def test_publish_request_resends_until_answered(state_dir, fake):
    f = fake()

    def on_bus(topic, body):
        # The first two copies are "lost"; a request is idempotent by id, so the third is answered.
        if topic == "request.turn" and len(f.bus_requests) == 3:
            f.publish(f"turn.{body['id']}.queued", {"id": body["id"], "position": 0})

    f.on_bus = on_bus
    with Client(state_dir) as client:
        sub = client.publish_request("turn", {"id": "bus1", "key": "codex", "argv": ["true"]})
        topic, body = sub.recv(1)
        sub.close()
    assert topic == "turn.bus1.queued"
    assert [t for t, _ in f.bus_requests] == ["request.turn"] * 3
    assert f.bus_requests[0][1]["argv"] == ["true"] and f.bus_requests[0][1]["v"] == 1


def test_publish_request_needs_an_id(state_dir, fake):
    fake()
    with Client(state_dir) as client, pytest.raises(CcsupError):
        client.publish_request("turn", {"key": "codex", "argv": ["true"]})


def test_a_recorded_pid_with_the_file_open_but_unlocked_is_not_holding_it(state_dir):
    """The fdinfo shortcut must see a lock, not just an open file, of the pid the file names."""
    lock = state_dir / "supervisor.lock"
    script = (
        "import fcntl, os, sys\n"
        f"fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT, 0o600)\n"
        "os.pwrite(fd, f'{os.getpid()}\\n'.encode(), 0)\n"
        "for step in sys.stdin:\n"
        "    fcntl.flock(fd, fcntl.LOCK_EX if step.strip() == 'lock' else fcntl.LOCK_UN)\n"
        "    print('done', flush=True)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:

        def step(word: str) -> None:
            child.stdin.write(word + "\n")
            child.stdin.flush()
            assert child.stdout.readline() == "done\n"

        step("unlock")  # open, pid written, no lock yet
        assert lock_held(lock) is False
        step("lock")
        assert lock_held(lock) is True
        step("unlock")
        assert lock_held(lock) is False
    finally:
        child.kill()
        child.wait()


# -- narrow subscriptions: the family counters ------------------------------------------------------


def test_a_narrow_subscription_counts_holes_in_turn_seq_and_supervisor_seq(state_dir, fake):
    f = fake()
    losses = []
    with Client(state_dir) as client, client.subscribe(["turn.a."], on_loss=losses.append) as sub:
        f.publish("turn.a.queued", {"id": "a", "turn_seq": 1})
        f.publish("turn.b.queued", {"id": "b", "turn_seq": 1})
        f.publish("supervisor.reloaded", {"supervisor_seq": 1})
        f.publish("turn.a.granted", {"id": "a", "turn_seq": 2})
        f.publish("turn.a.stdout", {"id": "a", "turn_seq": 4, "offset": 0, "data": ""})
        f.publish("supervisor.reloaded", {"supervisor_seq": 3})
        f.publish("turn.a.stdout", {"id": "a", "turn_seq": 5, "offset": 0, "data": ""})
        got = [sub.recv(2) for _ in range(4)]
        assert [(t, b["turn_seq"]) for t, b in got] == [
            ("turn.a.queued", 1),
            ("turn.a.granted", 2),
            ("turn.a.stdout", 4),
            ("turn.a.stdout", 5),
        ]  # neither turn b nor the watched supervisor family is yielded
        assert sub.recv(0.1) is None
        assert losses == [Loss("turn_seq", "a", 3, 3), Loss("supervisor_seq", None, 2, 2)]
        assert sub.gaps == 2


def test_run_turn_ends_even_when_the_terminal_event_is_lost(state_dir, fake):
    f = None

    def handler(cmd, args):
        if cmd == "status":  # run_turn's first question (supervisor.client.ride_through)
            return {"pid": os.getpid(), "epoch": "e1", "adopt_within": 0.0}
        t = args["id"]
        for n, kind in enumerate(("queued", "granted", "started"), 1):
            f.publish(f"turn.{t}.{kind}", {"id": t, "key": "k", "turn_seq": n})
        # exited, gone and released (turn_seq 4-6) are lost on the way; the end is announced
        f.publish(
            "supervisor.turn_ended",
            {"id": t, "key": "k", "state": "released", "turn_seq": 6, "supervisor_seq": 1},
        )
        return {"id": t, "state": "queued", "position": 0}

    f = fake(handler)
    with Client(state_dir) as client:
        events = list(client.run_turn("k", ["true"], id="t1"))
    assert [t for t, _ in events] == [
        f"turn.t1.{k}" for k in ("queued", "granted", "started", "released")
    ]
    assert events[-1][1] == {"id": "t1", "key": "k", "inferred": True}


def test_a_turn_ended_for_a_turn_seen_to_its_end_changes_nothing(state_dir, fake):
    f = fake()
    losses = []
    with Client(state_dir) as client, client.subscribe(["turn.a."], on_loss=losses.append) as sub:
        sub.expect_turn("a")
        f.publish("turn.a.rejected", {"id": "a", "turn_seq": 1})
        f.publish("supervisor.turn_ended", {"id": "a", "state": "rejected", "turn_seq": 1})
        f.publish("supervisor.turn_ended", {"id": "zz", "state": "released", "turn_seq": 9})
        assert sub.recv(2)[0] == "turn.a.rejected"
        assert sub.recv(0.2) is None
        assert (losses, sub.gaps) == ([], 0)
