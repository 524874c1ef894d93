"""The guard's bus hints (`--bus`): topics, bodies, and that zmq stays out of a bus-less guard."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time

import pytest
from conftest import PYTHON

from guardd.launch import guard_command
from guardd.zygote_handle import Zygote

zmq = pytest.importorskip("zmq")
from zmq.utils.monitor import recv_monitor_message  # noqa: E402


@pytest.mark.parametrize("launch", ["module", "launch"])
def test_hints_group_exited_gone_are_published(tmp_path, state_dir, launch):
    endpoint = f"ipc://{state_dir}/bus-in"
    ctx = zmq.Context()
    # stands in for the supervisor's proxy: an XSUB bound at bus-in carrying a subscription
    sub = ctx.socket(zmq.XSUB)
    sub.bind(endpoint)
    sub.send(b"\x01guard.")
    try:
        script = "setsid sleep 300 & sleep 0.3; exit 5"  # a group of its own, seen by a scan
        args = [
            "--record-dir",
            str(tmp_path),
            "--grace",
            "0.2",
            "--scan",
            "0.05",
            "--turn",
            "t1",
            "--bus",
            endpoint,
            "--",
            "sh",
            "-c",
            script,
        ]
        # as a person runs it, and as the supervisor does (python -I -S: no pyzmq importable)
        command = [PYTHON, "-m", "guardd", *args] if launch == "module" else guard_command(args)
        proc = subprocess.Popen(command)
        # Keep polling, as the proxy does: a bound socket attaches a new peer (and sends it the
        # subscription) only when its owner calls into it.
        got = {}
        threads = []
        deadline = time.monotonic() + 10
        while "gone" not in got and time.monotonic() < deadline:
            if sub.poll(10):
                topic, body = sub.recv_multipart()
                got[topic.decode().rsplit(".", 1)[1]] = (topic.decode(), json.loads(body))
                if "exited" not in got:  # the guard publishing, as it runs CMD
                    threads.append(_threads(proc.pid))
        assert proc.wait(10) == 5
    finally:
        sub.close(0)
        ctx.term()
    (rec_path,) = tmp_path.glob("*.json")
    rec = json.loads(rec_path.read_text())
    assert set(got) == {"group", "exited", "gone"}
    assert threads == [1]  # hints go out from the guard's own loop: no thread of their own
    for event, (topic, body) in got.items():
        assert topic == f"guard.t1.{event}"
        assert body["v"] == 1 and body["turn"] == "t1" and body["guard"] == rec["guard"]
        assert isinstance(body["ts"], float)
    assert got["exited"][1]["code"] == 5 and got["exited"][1]["signal"] is None
    assert got["gone"][1]["record"] == str(rec_path)
    (group,) = rec["groups"]
    assert {k: got["group"][1][k] for k in ("pgid", "leader_start")} == {
        "pgid": group["pgid"],
        "leader_start": group["leader_start"],
    }


def _threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))


def test_guard_without_bus_never_imports_zmq():
    code = (
        "import sys, guardd.__main__ as m\n"
        "rc = m.main(['--grace', '0.1', '--', 'true'])\n"
        "assert 'zmq' not in sys.modules and 'psutil' not in sys.modules, 'imported'\n"
        "sys.exit(rc)\n"
    )
    assert subprocess.run([PYTHON, "-c", code], timeout=10).returncode == 0


# --- the stdlib ZMTP publisher (guardd.hints) against real libzmq peers -------------------------

from guardd import hints  # noqa: E402


def _collect(sock, until, pub=None, timeout=10.0):
    """Poll a bound zmq socket (as the proxy does) until `until(messages)` or the timeout; the
    publisher, which has no thread, is driven meanwhile as the guard's loop drives it."""
    got = []
    deadline = time.monotonic() + timeout
    while not until(got) and time.monotonic() < deadline:
        if pub is not None:
            pub.wait(0.005)
        if sock.poll(5):
            got.append(sock.recv_multipart())
    return got


def test_frames_are_zmtp_3_encoded():
    assert hints.frame(b"abc", 0x01) == b"\x01\x03abc"
    assert hints.frame(b"x" * 255) == b"\x00\xff" + b"x" * 255
    assert hints.frame(b"x" * 256) == b"\x02" + (256).to_bytes(8, "big") + b"x" * 256
    assert hints.ready_command() == (b"\x04\x19\x05READY\x0bSocket-Type\x00\x00\x00\x03PUB")
    assert hints.message(b"t", b"b") == b"\x01\x01t\x00\x01b"
    assert (
        len(hints._GREETING) == 64 and hints._GREETING[:12] == b"\xff" + bytes(8) + b"\x7f\x03\x00"
    )


@pytest.mark.parametrize("kind", ["XSUB", "SUB"])
def test_publisher_reaches_a_bound_zmq_socket_over_ipc(state_dir, kind):
    endpoint = f"ipc://{state_dir}/bus-in"
    ctx = zmq.Context()
    sock = ctx.socket(getattr(zmq, kind))
    sock.bind(endpoint)
    if kind == "XSUB":
        sock.send(b"\x01guard.")
    else:
        sock.subscribe(b"guard.t2.")  # a SUB filters on its side
    try:
        pub = hints.Publisher(endpoint, "t2", {"pid": 1, "start": 2})
        pub.publish("group", pgid=7, leader_start=None, pad="é" * 300)  # a LONG frame
        pub.publish("gone", record=None)
        got = _collect(sock, lambda got: len(got) == 2, pub)
        pub.close()
    finally:
        sock.close(0)
        ctx.term()
    assert [t for t, _ in got] == [b"guard.t2.group", b"guard.t2.gone"]
    body = json.loads(got[0][1])
    assert len(got[0][1]) > 255 and body["pad"] == "é" * 300 and body["pgid"] == 7
    assert body["turn"] == "t2" and body["guard"] == {"pid": 1, "start": 2}


def test_publisher_over_tcp_and_close_delivers_the_last_hint():
    ctx = zmq.Context()
    sock = ctx.socket(zmq.XSUB)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    try:
        pub = hints.Publisher(f"tcp://127.0.0.1:{port}", "t3", {})
        pub.publish("exited", code=0, signal=None)
        first = _collect(sock, lambda got: len(got) == 1, pub)
        pub.publish("gone", record=None)
        pub.close()  # returns once the peer has read it all, or after its bound
        rest = _collect(sock, lambda got: len(got) == 1, timeout=2)
    finally:
        sock.close(0)
        ctx.term()
    assert [t for t, _ in first + rest] == [b"guard.t3.exited", b"guard.t3.gone"]


def test_no_bus_or_a_silent_peer_costs_at_most_the_bounds(state_dir, monkeypatch):
    # The connect bound made long, so that a close bounded by it, not by _CLOSE_WAIT, is told
    # apart from a late wake-up on a loaded machine.
    monkeypatch.setattr(hints, "_CONNECT_WAIT", 5.0)
    bound = hints._CLOSE_WAIT + 2.0
    # No socket at all: nothing to connect to, close returns at once.
    pub = hints.Publisher(f"ipc://{state_dir}/absent", "t4", {})
    pub.publish("gone", record=None)
    t = time.monotonic()
    pub.close()
    assert time.monotonic() - t < bound
    # A listener that accepts and never answers the greeting: the close bound holds.
    server = socket.socket(socket.AF_UNIX)
    server.bind(f"{state_dir}/silent")
    server.listen()
    try:
        pub = hints.Publisher(f"ipc://{state_dir}/silent", "t4", {})
        pub.publish("gone", record=None)
        t = time.monotonic()
        pub.close()
        assert time.monotonic() - t < bound
    finally:
        server.close()


def test_a_curve_peer_is_refused_with_one_line(tmp_path, state_dir):
    public, secret = zmq.curve_keypair()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.XSUB)
    sock.curve_server = True
    sock.curve_secretkey = secret
    endpoint = f"tcp://127.0.0.1:{sock.bind_to_random_port('tcp://127.0.0.1')}"
    try:
        proc = subprocess.Popen(
            [
                PYTHON,
                "-m",
                "guardd",
                "--grace",
                "0.2",
                "--bus",
                endpoint,
                "--",
                "sh",
                "-c",
                "sleep 0.3; exit 3",
            ],
            stderr=subprocess.PIPE,
        )
        _collect(sock, lambda got: proc.poll() is not None)
        assert proc.wait(10) == 3
        err = proc.stderr.read().decode()
        proc.stderr.close()
    finally:
        sock.close(0)
        ctx.term()
    # libzmq closes without a word (its greeting unsent) when it does not accept the mechanism
    assert err == (
        f"ccsup-guard: unable to publish hints on {endpoint}: the peer closed the"
        " connection in the handshake (a CURVE endpoint? the guard speaks only NULL)\n"
    )


def test_an_ipc_peer_gone_in_the_handshake_is_a_bus_down_and_says_nothing(tmp_path, state_dir):
    """A supervisor killed while a guard connects closes the connection before its greeting,
    as a CURVE tcp peer does; on ipc:// (never CURVE here) that is a bus down: not a word
    in the turn's stderr, and the turn runs on."""
    path = state_dir / "bus-in"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(8)
    proc = subprocess.Popen(
        [PYTHON, "-m", "guardd", "--grace", "0.2", "--bus", f"ipc://{path}", "--",
         "sh", "-c", "sleep 0.3; exit 3"],
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        listener.settimeout(10)
        conn, _ = listener.accept()  # the guard connects at once, before any hint
        conn.settimeout(10)
        assert conn.recv(64)  # the guard's greeting
        conn.close()  # gone, its own greeting unsent
        assert proc.wait(10) == 3
        err = proc.stderr.read().decode()
    finally:
        listener.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
    assert err == ""


def test_a_refused_bus_with_stderr_gone_still_ends_the_turn_as_usual(tmp_path, state_dir):
    """The publisher runs in the guard's own loop: saying why hints are dropped must not end a
    (forked) guard whose stderr is gone (a supervisor killed outright): the turn ends as usual."""
    public, secret = zmq.curve_keypair()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.XSUB)
    sock.curve_server = True  # refuses the guard's NULL handshake: the publisher says so
    sock.curve_secretkey = secret
    endpoint = f"tcp://127.0.0.1:{sock.bind_to_random_port('tcp://127.0.0.1')}"
    zygote = Zygote.start()
    err_r, err_w = os.pipe()
    os.close(err_r)  # every write to the guard's stderr fails (EPIPE)
    null = os.open(os.devnull, os.O_RDWR)
    try:
        args = ["--record-dir", str(tmp_path), "--grace", "0.2", "--bus", endpoint, "--"]
        spawned = zygote.spawn(
            [*args, "sh", "-c", "sleep 0.3; exit 3"],
            cwd=None,
            env=dict(os.environ),
            stdio=(null, null, err_w),
        )
        os.close(spawned.pidfd)
        reports: list = []
        _collect(sock, lambda got: reports.extend(zygote.poll_reports()) or reports)
        assert reports == [(spawned.pid, 3)]
    finally:
        os.close(null)
        os.close(err_w)
        zygote.close()
        sock.close(0)
        ctx.term()
    (rec_path,) = tmp_path.glob("*.json")
    assert json.loads(rec_path.read_text())["state"] == "gone"


def test_an_idle_publisher_lets_its_connection_go_and_reconnects_for_the_next_hint(
    state_dir, monkeypatch
):
    """A long turn holds no connection while it has nothing to say (each held ~24 KiB of the
    supervisor's ZeroMQ buffers); a short one keeps the one made at its start."""
    monkeypatch.setattr(hints, "_IDLE", 0.3)
    endpoint = f"ipc://{state_dir}/bus-in"
    ctx = zmq.Context()
    sock = ctx.socket(zmq.XSUB)
    monitor = sock.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
    sock.bind(endpoint)
    sock.send(b"\x01guard.")

    def next_event(timeout: float = 5.0) -> int:
        deadline = time.monotonic() + timeout
        while not monitor.poll(5):
            assert time.monotonic() < deadline, "no connection event"
            pub.wait(0.005)  # the publisher's idle deadline passes only when it is driven
        return recv_monitor_message(monitor)["event"]

    try:
        pub = hints.Publisher(endpoint, "t4", {})
        assert next_event() == zmq.EVENT_ACCEPTED  # at once, before any hint
        pub.publish("group", pgid=7, leader_start=None)
        first = _collect(sock, lambda got: len(got) == 1, pub)
        assert next_event() == zmq.EVENT_DISCONNECTED  # idle: let go
        pub.publish("exited", code=0, signal=None)
        assert next_event() == zmq.EVENT_ACCEPTED  # connected again for the next hint
        rest = _collect(sock, lambda got: len(got) == 1, pub)
        pub.close()
    finally:
        monitor.close(0)
        sock.disable_monitor()
        sock.close(0)
        ctx.term()
    assert [t for t, _ in first + rest] == [b"guard.t4.group", b"guard.t4.exited"]
