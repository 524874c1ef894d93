"""A real etcd cluster for tests, and a TCP relay a test owns to cut a machine off from it.

The etcd binary is Debian's `etcd-server`, unpacked by .ci/run into a cache folder (never
installed): found at $CCSUP_ETCD_BIN, else in that cache folder, else `etcd` on PATH. Without it,
every test that asks for a cluster is skipped, saying why.

`etcd_cluster` (a fixture) starts three members on 127.0.0.1 with free ports and their data in a
temporary folder, waits until every member says it is healthy, and ends each member by its pid
when the test ends. Members are started without the test run's marker, so the per-test
leftover check does not count them: this fixture ends them itself, by pid, SIGKILL if need be.

`Relay` forwards TCP connections to one address from a thread, until `block()`: then nothing is
read or written any more (bytes stay in the kernel's buffers, new connections wait unanswered),
as in a real partition, where a peer hangs rather than refuses; `unblock()` resumes.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

MARKER = "CCSUP_TEST_RUN"


def etcd_binary() -> str | None:
    given = os.environ.get("CCSUP_ETCD_BIN")
    if given:
        return given if os.access(given, os.X_OK) else None
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    cached = cache / "ccsup-ci" / "etcd-server" / "usr" / "bin" / "etcd"
    if os.access(cached, os.X_OK):
        return str(cached)
    return shutil.which("etcd")


def free_ports(n: int) -> list[int]:
    """n distinct free ports on 127.0.0.1 (all held open together while chosen)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _post(url: str, body: dict, timeout: float = 1.0) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


class Member:
    def __init__(self, binary: str, name: str, client_port: int, peer_port: int, data: Path):
        self.binary, self.name = binary, name
        self.client_port, self.peer_port = client_port, peer_port
        self.data = data
        self.proc: subprocess.Popen | None = None
        self.log = data.parent / f"{name}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def start(self, initial_cluster: str) -> None:
        env = {k: v for k, v in os.environ.items() if k != MARKER}
        args = [
            self.binary,
            f"--name={self.name}",
            f"--data-dir={self.data}",
            f"--listen-client-urls={self.url}",
            f"--advertise-client-urls={self.url}",
            f"--listen-peer-urls={self.peer_url}",
            f"--initial-advertise-peer-urls={self.peer_url}",
            f"--initial-cluster={initial_cluster}",
            "--initial-cluster-state=new",
            "--initial-cluster-token=ccsup-test",
            # Fast elections, so a lost leader costs well under a second; the minimum lease TTL
            # follows (1.5 election timeouts).
            "--heartbeat-interval=50",
            "--election-timeout=500",
            "--logger=zap",
            "--log-level=warn",
        ]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env
            )

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.kill()

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=0.5) as resp:
                return json.loads(resp.read()).get("health") == "true"
        except (OSError, ValueError):
            return False

    def status(self) -> dict | None:
        try:
            return _post(self.url + "/v3/maintenance/status", {}, timeout=0.5)
        except (OSError, ValueError):
            return None


class EtcdCluster:
    def __init__(self, binary: str, base: Path, size: int = 3):
        ports = free_ports(2 * size)
        self.members = [
            Member(binary, f"m{i}", ports[2 * i], ports[2 * i + 1], base / f"m{i}")
            for i in range(size)
        ]
        self.initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)

    @property
    def endpoints(self) -> list[str]:
        return [m.url for m in self.members]

    def start(self, timeout: float = 20.0) -> EtcdCluster:
        for m in self.members:
            m.start(self.initial)
        self.wait_healthy(timeout)
        return self

    def start_member(self, member: Member) -> None:
        member.start(self.initial)  # its data folder remembers the cluster

    def wait_healthy(self, timeout: float = 20.0, members: list[Member] | None = None) -> None:
        deadline = time.monotonic() + timeout
        for m in members or self.members:
            while not m.healthy():
                if not m.running():
                    raise RuntimeError(f"etcd member {m.name} exited: {m.log.read_text()[-2000:]}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"etcd member {m.name} not healthy in {timeout}s")
                time.sleep(0.05)

    def leader(self, timeout: float = 10.0) -> Member:
        deadline = time.monotonic() + timeout
        while True:
            for m in self.members:
                if not m.running():
                    continue
                st = m.status()
                if st and st.get("leader") and st["leader"] == st["header"]["member_id"]:
                    return m
            if time.monotonic() > deadline:
                raise RuntimeError("no etcd leader")
            time.sleep(0.05)

    def close(self) -> None:
        for m in self.members:
            m.kill()


@contextlib.contextmanager
def running_cluster() -> Iterator[EtcdCluster]:
    binary = etcd_binary()
    if binary is None:
        pytest.skip(
            "no etcd binary: run .ci/run once (it unpacks etcd-server) or set CCSUP_ETCD_BIN"
        )
    base = Path(tempfile.mkdtemp(prefix="ccsup-etcd-", dir="/tmp"))
    cluster = EtcdCluster(binary, base)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def etcd_cluster() -> Iterator[EtcdCluster]:
    """A fresh 3-member etcd cluster on 127.0.0.1, ended by pid after the test (faults allowed)."""
    with running_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="module")
def etcd_shared() -> Iterator[EtcdCluster]:
    """One cluster for a module's tests that break nothing (each uses keys of its own)."""
    with running_cluster() as cluster:
        yield cluster


# -- a relay the test owns ----------------------------------------------------------------------


class Relay:
    """127.0.0.1:<port> -> target, from one thread, until block(); see the module's docstring."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]
        self._wake_r, self._wake_w = socket.socketpair()
        self._peer: dict[socket.socket, socket.socket] = {}
        self._pending: list[socket.socket] = []
        self._blocked = False
        self._closed = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def block(self) -> None:
        with self._lock:
            self._blocked = True
        self._wake_w.send(b"x")

    def unblock(self) -> None:
        with self._lock:
            self._blocked = False
        self._wake_w.send(b"x")

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._wake_w.send(b"x")
        self._thread.join(5)

    def _connect(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target, timeout=1.0)
        except OSError:
            client.close()
            return
        upstream.setblocking(False)
        client.setblocking(False)
        self._peer[client] = upstream
        self._peer[upstream] = client

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._wake_r, selectors.EVENT_READ)
        registered: set[socket.socket] = set()
        listening = False
        while True:
            with self._lock:
                blocked, closed = self._blocked, self._closed
            if closed:
                break
            want = set() if blocked else set(self._peer)
            if not blocked and self._pending:
                for client in self._pending:
                    self._connect(client)
                self._pending.clear()
                want = set(self._peer)
            for s in registered - want:
                sel.unregister(s)
            for s in want - registered:
                sel.register(s, selectors.EVENT_READ)
            registered = want
            if not listening:
                sel.register(self._listener, selectors.EVENT_READ)
                listening = True
            for key, _ in sel.select(0.5):
                s = key.fileobj
                if s is self._wake_r:
                    self._wake_r.recv(64)
                elif s is self._listener:
                    try:
                        client, _ = self._listener.accept()
                    except BlockingIOError:
                        continue
                    if blocked:
                        self._pending.append(client)  # held, unanswered, as a partition does
                    else:
                        self._connect(client)
                elif s in self._peer and s in registered:
                    self._pump(s, sel, registered)
        sel.close()
        for s in [*self._peer, *self._pending, self._listener, self._wake_r, self._wake_w]:
            s.close()

    def _pump(self, s: socket.socket, sel: selectors.BaseSelector, registered: set) -> None:
        other = self._peer[s]
        try:
            data = s.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            try:
                other.setblocking(True)
                other.sendall(data)
                other.setblocking(False)
                return
            except OSError:
                pass
        for x in (s, other):
            if x in registered:
                sel.unregister(x)
                registered.discard(x)
            self._peer.pop(x, None)
            x.close()


@pytest.fixture
def relay():
    """A factory: relay((host, port)) starts a Relay; all are closed after the test."""
    made: list[Relay] = []

    def make(target: tuple[str, int]) -> Relay:
        r = Relay(target)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()
