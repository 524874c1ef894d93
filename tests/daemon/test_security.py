"""Security promises, on a real supervisor: a private state directory, private sockets, refused unsafe
directories and plain tcp, CURVE end to end on loopback, and turn environments written nowhere.

Only loopback addresses are ever bound or dialled here.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import socket
import stat
import subprocess
import time
from pathlib import Path

import pytest
import zmq
from conftest import PYTHON, RunningDaemon, wait_until, write_config
from zmq.utils import z85

from supervisor import config as cfg
from supervisor.client import CLIENT_KEY_ENV, Client
from supervisor.daemon.server import ZAP_DOMAIN, Server, zap_answer
from supervisor.errors import CcsupError, ConfigError


def ccsup(
    state_dir: Path, config: Path, *args: str, timeout: float = 20, env: dict | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-m", "supervisor", "--state-dir", str(state_dir), "--config", str(config), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env=None if env is None else {**os.environ, **env},
    )


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# -- the state directory and its sockets ----------------------------------------------------------


def test_the_state_directory_is_created_0700_and_its_sockets_0600_whatever_the_umask(state_dir):
    fresh = state_dir / "fresh" / "state"  # does not exist yet: the supervisor makes it
    d = RunningDaemon(fresh, write_config(state_dir))
    d.stderr_path = state_dir / "daemon.stderr"
    old = os.umask(0)  # the child inherits it: the modes must not come from a kind umask
    try:
        d.start()
    finally:
        os.umask(old)
    try:
        assert mode(fresh) == 0o700
        for sub in ("guards", "slots", "turns"):
            assert mode(fresh / sub) == 0o700, sub
        for name in ("control", "bus-in", "bus-out"):
            st = os.lstat(fresh / name)
            assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600, name
        assert mode(fresh / "supervisor.lock") == 0o600
    finally:
        assert d.stop() == 0


@pytest.mark.parametrize(
    "owner, perms, says",
    [
        (65534, 0o700, ["belongs to uid 65534", "--state-dir"]),
        (None, 0o770, ["group or others may write", "mode 770", "chmod 700"]),
        (None, 0o777, ["group or others may write", "mode 777", "chmod 700"]),
        (None, 0o702, ["group or others may write", "chmod 700"]),
    ],
)
@pytest.mark.parametrize("foreground", [False, True])
def test_start_refuses_a_state_directory_of_another_user_or_writable_by_others(
    state_dir, owner, perms, says, foreground
):
    if owner is not None and os.geteuid() != 0:
        pytest.skip("giving a directory to another user needs root")
    unsafe = state_dir / "unsafe"
    unsafe.mkdir()
    os.chmod(unsafe, perms)
    if owner is not None:
        os.chown(unsafe, owner, -1)
    config = write_config(state_dir)
    result = ccsup(unsafe, config, "start", *(["--foreground"] if foreground else []), timeout=10)
    if result.returncode == 0:  # it started where it must not: stop it before failing
        ccsup(unsafe, config, "stop")
    assert result.returncode == 1, result
    message = result.stderr
    assert f"refusing state directory {unsafe}" in message and all(s in message for s in says), (
        message
    )
    # nothing was made inside: no socket, no lock, no subdirectory
    assert sorted(os.listdir(unsafe)) == []


def test_the_history_the_log_and_a_turns_output_are_made_0600_whatever_the_umask(state_dir):
    private = state_dir / "private"
    config = write_config(state_dir, caps="codex = 1")
    old = os.umask(0)  # the daemon inherits it: modes must not come from a kind umask
    try:
        started = ccsup(private, config, "start")  # in the background: it logs to ccsup.log
    finally:
        os.umask(old)
    assert started.returncode == 0, started
    try:
        ran = ccsup(
            private, config, "run", "--key", "codex", "--", "sh", "-c", "echo out; echo err >&2"
        )
        assert ran.returncode == 0 and ran.stdout == "out\n", ran
        (turn,) = os.listdir(private / "turns")
        history = private / "history.sqlite"
        wait_until(lambda: (private / "history.sqlite-wal").exists(), what="the history's WAL")
        made = [
            history,
            private / "history.sqlite-wal",
            private / "history.sqlite-shm",
            private / "ccsup.log",
            *(private / "turns" / turn / name for name in ("stdout.log", "stderr.log")),
        ]
        assert {path.name: mode(path) for path in made} == {path.name: 0o600 for path in made}
    finally:
        assert ccsup(private, config, "stop").returncode == 0


# -- tcp:// endpoints -----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tcp_config(
    state_dir: Path,
    curve: tuple[bytes, bytes] | None,
    client_keys: list[bytes] = (),
    client_secret: bytes | None = None,
) -> tuple[Path, dict]:
    ports = {name: free_port() for name in ("control", "bus_in", "bus_out")}
    extra = "[endpoints]\n" + "".join(
        f'{name} = "tcp://127.0.0.1:{port}"\n' for name, port in ports.items()
    )
    if curve is not None:
        public, secret = curve
        extra += f'[endpoints.curve]\npublic_key = "{public.decode()}"\nsecret_key = "{secret.decode()}"\n'
        if client_keys:
            extra += f"client_keys = [{', '.join(repr(key.decode()) for key in client_keys)}]\n"
        if client_secret is not None:
            extra += f'client_secret_key = "{client_secret.decode()}"\n'
    return write_config(state_dir, caps="codex = 1", extra=extra), ports


def test_a_tcp_endpoint_without_curve_keys_is_refused_at_check_and_at_start(state_dir):
    config, _ = tcp_config(state_dir, None)
    for args in (["config", "check"], ["start"], ["start", "--foreground"]):
        result = ccsup(state_dir, config, *args)
        assert result.returncode == 2, (args, result)
        assert "endpoints.control" in result.stderr and "[endpoints.curve]" in result.stderr, (
            args,
            result.stderr,
        )
    assert not (state_dir / "supervisor.lock").exists()


def test_a_tcp_endpoint_without_client_keys_is_refused_at_check_and_at_start_naming_key_and_line(
    state_dir,
):
    config, _ = tcp_config(state_dir, zmq.curve_keypair())
    header = config.read_text().splitlines().index("[endpoints.curve]") + 1
    for args in (["config", "check"], ["start"], ["start", "--foreground"]):
        result = ccsup(state_dir, config, *args)
        assert result.returncode == 2, (args, result)
        assert (
            f"{config}:{header}: endpoints.curve.client_keys: a tcp:// endpoint needs the public keys of the "
            "clients it lets in" in result.stderr
        ), (args, result.stderr)
    assert not (state_dir / "supervisor.lock").exists()
    # The Server itself refuses the same, for code that builds one without a config.
    public, secret = (k.decode() for k in zmq.curve_keypair())
    for keys in ([], None):
        curve = {
            "public_key": public,
            "secret_key": secret,
            **({} if keys is None else {"client_keys": keys}),
        }
        with pytest.raises(
            ConfigError,
            match=r"endpoints.curve.client_keys: tcp://127.0.0.1:1 \(endpoints.control\)",
        ):
            Server("tcp://127.0.0.1:1", "ipc:///tmp/x-in", "ipc:///tmp/x-out", curve)


def test_zap_answer_lets_in_only_listed_curve_keys_in_the_ccsup_domain():
    allowed_public, _ = zmq.curve_keypair()
    other_public, _ = zmq.curve_keypair()
    allowed, other = z85.decode(allowed_public), z85.decode(other_public)
    head = [b"1.0", b"req-7"]

    def ask(domain, mechanism, *cred):
        return zap_answer(
            head + [domain, b"127.0.0.1", b"", mechanism, *cred], frozenset({allowed})
        )

    assert ask(ZAP_DOMAIN, b"CURVE", allowed) == (
        [b"1.0", b"req-7", b"200", b"OK", allowed_public, b""],
        None,
    )
    assert ask(ZAP_DOMAIN, b"CURVE", other) == (
        [b"1.0", b"req-7", b"400", b"client key not allowed", b"", b""],
        other,
    )
    assert ask(ZAP_DOMAIN, b"NULL")[0][2] == b"400"
    assert ask(ZAP_DOMAIN, b"PLAIN", b"user", b"pass")[0][2] == b"400"
    assert ask(ZAP_DOMAIN, b"CURVE", allowed, allowed)[0][2] == b"400"
    assert ask(b"", b"NULL")[0][2] == b"200"  # an ipc socket without a domain (the guard bus)
    assert ask(b"", b"CURVE", allowed)[0][2] == b"400"
    assert ask(b"other", b"CURVE", allowed)[0][2] == b"400"
    assert zap_answer([b"1.0", b"r"], frozenset({allowed}))[0] == [
        b"1.0",
        b"r",
        b"500",
        b"malformed ZAP request",
        b"",
        b"",
    ]
    assert (
        zap_answer([b"2.0", b"r", ZAP_DOMAIN, b"", b"", b"CURVE", allowed], frozenset({allowed}))[
            0
        ][2]
        == b"500"
    )


def test_a_client_without_a_curve_key_fails_at_once_naming_where_to_put_one(state_dir, monkeypatch):
    monkeypatch.delenv(CLIENT_KEY_ENV, raising=False)
    (state_dir / "supervisor.lock").write_text(f"{os.getpid()}\n")
    public, secret = (k.decode() for k in zmq.curve_keypair())
    endpoints = cfg.Endpoints(
        "tcp://127.0.0.1:1",
        "tcp://127.0.0.1:2",
        "tcp://127.0.0.1:3",
        {"public_key": public, "secret_key": secret, "client_keys": [public]},
    )
    with open(
        state_dir / "supervisor.lock"
    ) as lock:  # "running": the check happens before any connect
        fcntl.flock(lock, fcntl.LOCK_EX)
        with Client(state_dir, endpoints=endpoints, timeout=5.0) as client:
            started = time.monotonic()
            with pytest.raises(
                ConfigError,
                match=r"unable to connect to tcp://127.0.0.1:1: no CURVE client key; "
                r"set \$CCSUP_CLIENT_SECRET_KEY or \[endpoints.curve\] client_secret_key",
            ):
                client.status()
            assert time.monotonic() - started < 1.0
        monkeypatch.setenv(CLIENT_KEY_ENV, "not a key")
        with Client(state_dir, endpoints=endpoints, timeout=5.0) as client:
            with pytest.raises(
                ConfigError, match=r"\$CCSUP_CLIENT_SECRET_KEY is not a CURVE secret key"
            ):
                client.status()


class TcpDaemon(RunningDaemon):
    """A daemon found through the config's tcp:// endpoints (no ipc socket to look for)."""

    def client(self, timeout: float = 5.0, endpoints=None):
        return Client(self.state_dir, endpoints=endpoints or self.endpoints, timeout=timeout)

    def start(self, timeout: float = 15.0) -> TcpDaemon:
        self.endpoints = cfg.load(str(self.config), os.environ).endpoints.resolve(self.state_dir)
        try:
            super().start(timeout=timeout)
        except BaseException:
            self.kill()
            raise
        return self


@pytest.mark.timeout(90)
def test_curve_on_loopback_tcp_works_end_to_end_for_a_listed_client_and_one_without_the_server_key_gets_nothing(
    state_dir,
):
    server_keys = zmq.curve_keypair()
    cli_public, cli_secret = zmq.curve_keypair()  # the config's own client, as `ccsup` uses it
    env_public, env_secret = zmq.curve_keypair()  # another listed client, given by the environment
    config, ports = tcp_config(state_dir, server_keys, [cli_public, env_public], cli_secret)
    assert ccsup(state_dir, config, "config", "check").returncode == 0
    d = TcpDaemon(state_dir, config).start()
    try:
        assert not (state_dir / "control").exists()  # really over tcp
        # The CLI: with the config's client key, and with $CCSUP_CLIENT_SECRET_KEY, which wins over it.
        for env in (None, {CLIENT_KEY_ENV: env_secret.decode()}):
            result = ccsup(state_dir, config, "status", "--json", env=env)
            assert result.returncode == 0 and json.loads(result.stdout)["pid"] == d.proc.pid, (
                env,
                result,
            )
        result = ccsup(state_dir, config, "status", env={CLIENT_KEY_ENV: "x" * 39})
        assert (
            result.returncode == 2
            and "$CCSUP_CLIENT_SECRET_KEY is not a CURVE secret key" in result.stderr
        )
        with d.client() as client:
            status = client.status()
            assert status["pid"] == d.proc.pid and status["turns"] == 0
            events = list(client.run_turn("codex", ["sh", "-c", "echo over-curve"], id="curve-1"))
            topics = [topic.rsplit(".", 1)[1] for topic, _ in events]
            assert topics[0] == "queued" and topics[-1] == "released" and "exited" in topics
            exited = next(body for topic, body in events if topic.endswith(".exited"))
            assert exited["code"] == 0
            stdout = "".join(body["data"] for topic, body in events if topic.endswith(".stdout"))
            assert stdout == "over-curve\n"
            # the guard's hints went over the private ipc guard bus: nothing of it in the turn's stderr
            assert [body for topic, body in events if topic.endswith(".stderr")] == []
            assert (state_dir / "turns" / "curve-1" / "stderr.log").read_bytes() == b""

        # A listed client that does not know the server's key, or one without CURVE, is never answered.
        other_public, _ = zmq.curve_keypair()
        wrong = cfg.Endpoints(
            d.endpoints.control,
            d.endpoints.bus_in,
            d.endpoints.bus_out,
            {
                "public_key": other_public.decode(),
                "secret_key": "",
                "client_secret_key": cli_secret.decode(),
            },
        )
        plain = cfg.Endpoints(d.endpoints.control, d.endpoints.bus_in, d.endpoints.bus_out, None)
        for endpoints in (wrong, plain):
            started = time.monotonic()
            with d.client(timeout=1.0, endpoints=endpoints) as client:
                with pytest.raises(CcsupError, match="did not answer"):
                    client.status()
            assert time.monotonic() - started >= 1.0
        # A raw subscriber without CURVE hears nothing of the bus either.
        ctx = zmq.Context()
        try:
            sub = ctx.socket(zmq.SUB)
            sub.connect(f"tcp://127.0.0.1:{ports['bus_out']}")
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            with d.client() as client:
                assert (
                    list(client.run_turn("codex", ["true"], id="curve-2"))[-1][0]
                    == "turn.curve-2.released"
                )
            assert not sub.poll(500)
        finally:
            ctx.destroy(linger=0)
        with d.client() as client:
            assert client.status()["pid"] == d.proc.pid
    finally:
        assert d.stop() == 0


def curve_socket(
    ctx: zmq.Context, kind: int, endpoint: str, server_public: bytes, pair: tuple[bytes, bytes]
) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.curve_serverkey = server_public
    sock.curve_publickey, sock.curve_secretkey = pair
    sock.connect(endpoint)
    return sock


@pytest.mark.timeout(90)
def test_a_client_with_a_valid_curve_pair_not_on_the_list_gets_nothing_on_control_or_bus(state_dir):
    server_keys = zmq.curve_keypair()
    allowed = zmq.curve_keypair()
    intruder = zmq.curve_keypair()
    config, ports = tcp_config(state_dir, server_keys, [allowed[0]], allowed[1])
    d = TcpDaemon(state_dir, config).start()
    ctx = zmq.Context()
    try:
        # Control: the intruder knows the server's public key and speaks CURVE, and is never answered,
        # not even `quit`.
        for cmd in ("status", "quit"):
            started = time.monotonic()
            with Client(
                state_dir,
                endpoints=d.endpoints,
                timeout=1.0,
                client_secret_key=intruder[1].decode(),
            ) as client:
                with pytest.raises(CcsupError, match="did not answer"):
                    client.call(cmd)
            assert time.monotonic() - started >= 1.0
        assert d.proc.poll() is None
        # The same Client code with the listed key is answered: the refusal is the key, nothing else.
        with Client(
            state_dir, endpoints=d.endpoints, timeout=1.0, client_secret_key=allowed[1].decode()
        ) as client:
            assert client.status()["pid"] == d.proc.pid

        # Bus: a listed PUB's request makes a turn; the intruder's, sent the same way, makes none; the
        # intruder's SUB hears nothing while a listed subscriber hears every event.
        bus_in, bus_out = (
            f"tcp://127.0.0.1:{ports['bus_in']}",
            f"tcp://127.0.0.1:{ports['bus_out']}",
        )
        spy = curve_socket(ctx, zmq.SUB, bus_out, server_keys[0], intruder)
        spy.setsockopt(zmq.SUBSCRIBE, b"")
        bad_pub = curve_socket(ctx, zmq.PUB, bus_in, server_keys[0], intruder)
        with d.client() as client, client.subscribe("") as everything:
            request = {
                "key": "codex",
                "argv": ["sh", "-c", "echo from-intruder"],
                "id": "intruder-1",
            }
            frames = [b"request.turn", json.dumps({"v": 1, "ts": time.time(), **request}).encode()]
            for _ in range(
                10
            ):  # a second of retries: a refused PUB has no connection to drop them into
                bad_pub.send_multipart(frames)
                time.sleep(0.1)
            with client.publish_request(
                "turn", {"key": "codex", "argv": ["true"], "id": "listed-1"}
            ) as sub:
                assert list(sub.until_terminal())[-1][0] == "turn.listed-1.released"
            topics = []
            while (got := everything.recv(timeout=0.2)) is not None:
                topics.append(got[0])
            assert "turn.listed-1.released" in topics
            assert [t for t in topics if "intruder" in t] == []
        assert not spy.poll(300)
        with d.client() as client:
            assert "intruder-1" not in json.dumps(client.ps())
        # The daemon says whom it refused, once per key, with the key to add if that was a mistake.
        log = d.stderr_path.read_text()
        refusals = [line for line in log.splitlines() if "refused a CURVE client" in line]
        assert len(refusals) == 1, refusals
        assert (
            f"from 127.0.0.1: its key {intruder[0].decode()} is not in endpoints.curve.client_keys"
            in refusals[0]
        )
    finally:
        ctx.destroy(linger=0)
        assert d.stop() == 0


# -- secrets --------------------------------------------------------------------------------------


def read_if_there(path: Path) -> bytes:
    """A spent guard record is removed by a thread soon after release: gone is not a leak."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


def every_file(root: Path) -> list[Path]:
    found = []
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            path = Path(dirpath) / name
            if path.is_file():
                found.append(path)
    return found


@pytest.mark.timeout(60)
def test_a_turns_env_reaches_its_process_and_is_written_nowhere(daemon, event_log, state_dir):
    d = daemon(caps="codex = 1")
    log = event_log(d)
    secret = secrets.token_hex(16)
    client = d.client()
    try:
        # A blocker holds the only slot, so the secret turn waits first (queue.json may hold its env
        # while it waits, 0600), then runs, then ends.
        client.turn("codex", ["sh", "-c", "echo ready; read line"], id="blocker")
        wait_until(lambda: log.find("turn.blocker.stdout"), what="the blocker to run")
        answer = client.turn(
            "codex",
            ["sh", "-c", "echo ready; read line; test ${#SECRET_TOKEN} -eq 32"],
            id="secret",
            env={"SECRET_TOKEN": secret, "CCSUP_UNSET_ME": None},
        )
        assert answer["state"] == "queued"
        queue = state_dir / "queue.json"
        if queue.exists():
            assert mode(queue) == 0o600
        client.send("blocker", "go\n", eof=True)
        log.wait_for("turn.blocker.released")
        started = log.wait_for("turn.secret.started")
        wait_until(lambda: log.find("turn.secret.stdout"), what="the secret turn to say ready")
        record_path = (
            state_dir / "guards" / f"{started['guard']['pid']}-{started['guard']['start']}.json"
        )
        # CMD may say ready before its guard has written the record (renamed into place whole)
        wait_until(record_path.exists, what="the secret turn's guard record")
        record = json.loads(record_path.read_text())
        cmd_pid = record["own_group"]["pgid"]  # CMD leads its own group
        environ = Path(f"/proc/{cmd_pid}/environ").read_bytes().split(b"\0")
        assert f"SECRET_TOKEN={secret}".encode() in environ
        client.send("secret", "go\n", eof=True)
        exited = log.wait_for("turn.secret.exited")
        assert exited["code"] == 0  # the turn saw a 32-character SECRET_TOKEN
        log.wait_for("turn.secret.released")
        needle = secret.encode()

        def found() -> list[str]:
            return [str(path) for path in every_file(state_dir) if needle in read_if_there(path)]

        # Its env file goes once the journal says it left the wait, by the file thread: soon.
        wait_until(lambda: found() == [], timeout=10, what="no file holding the secret")
        with log._cond:
            events = [(topic, body) for topic, body, _ in log.events]
        assert len(events) > 10 and [t for t, b in events if secret in json.dumps(b)] == []
        assert secret not in json.dumps(client.ps()) and secret not in json.dumps(client.status())
    finally:
        client.close()


@pytest.mark.parametrize("perms", [0o755, 0o750, 0o701])
def test_an_empty_state_directory_of_ours_that_others_may_only_enter_is_made_private(
    state_dir, perms
):
    """`mkdir` under the usual umask makes a directory 755: empty and ours, nothing in it was ever
    exposed, so start makes it 0700 and runs; one with anything in it is still refused."""
    loose = state_dir / "loose"
    loose.mkdir()
    os.chmod(loose, perms)
    config = write_config(state_dir)
    result = ccsup(loose, config, "start", timeout=30)
    try:
        assert result.returncode == 0, result
        assert stat.S_IMODE(os.stat(loose).st_mode) == 0o700
    finally:
        ccsup(loose, config, "stop")
    used = state_dir / "used"
    used.mkdir()
    (used / "something").write_text("")
    os.chmod(used, perms)
    refused = ccsup(used, config, "start", timeout=10)
    if refused.returncode == 0:
        ccsup(used, config, "stop")
    assert refused.returncode == 1 and "group or others may read or enter it" in refused.stderr
