"""The supervisor end to end: a real daemon, real guards, real sockets, real faults."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest
import zmq
from conftest import PYTHON, story, wait_until

from guardd import procs
from supervisor.wire import protocol

# A CMD whose setsid child ignores SIGTERM and writes its pid to a file: only SIGKILL ends it.
STUBBORN_CHILD = "setsid sh -c 'trap \"\" TERM; echo $$ > {pidfile}; exec sleep 300' &"


def stubborn(pidfile, then: str = "exec sleep 300") -> list[str]:
    return ["sh", "-c", STUBBORN_CHILD.format(pidfile=pidfile) + f" {then}"]


def start_stubborn_turns(client, state_dir, count: int) -> list[int]:
    """Turns t0.. each with a setsid child that ignores SIGTERM; returns the children's pids."""
    children = []
    for n in range(count):
        client.turn("codex", stubborn(state_dir / f"child{n}.pid"), id=f"t{n}")
        children.append(read_pid(state_dir / f"child{n}.pid"))
    return children


def read_pid(path) -> int:
    return int(wait_until(lambda: path.exists() and path.read_text().strip(), what=f"{path}"))


def dead(pid: int) -> bool:
    stat = procs.read_stat(pid)
    return stat is None or stat.zombie


def guard_record(state_dir, started: dict) -> dict:
    guard = started["guard"]
    path = state_dir / "guards" / f"{guard['pid']}-{guard['start']}.json"
    wait_until(path.exists, what=f"the guard record {path.name}")  # written just after CMD starts
    return json.loads(path.read_text())


def slot_of(client, turn_id: str) -> dict | None:
    return next(
        (s for s in client.ps()["slots"] if s["turn"] == turn_id and s["state"] != "free"), None
    )


def test_cap_holds_across_client_processes_and_grants_are_fifo(daemon, event_log, state_dir):
    d = daemon(caps="codex = 2")
    log = event_log(d)
    witness = state_dir / "witness"
    client_script = textwrap.dedent(
        f"""
        import sys
        from supervisor.client import Client
        n = sys.argv[1]
        ids = [f"c{{n}}-{{i}}" for i in range(5)]
        argv = ["sh", "-c", "echo start $CCSUP_TURN >> {witness}; sleep 0.1; echo end $CCSUP_TURN >> {witness}"]
        with Client(sys.argv[2]) as client, client.subscribe([f"turn.c{{n}}-"]) as sub:
            for turn_id in ids:
                client.turn("codex", argv, id=turn_id)
            done = set()
            while len(done) < len(ids):
                topic, body = sub.recv(30)
                if topic.endswith((".released", ".cancelled", ".rejected")):
                    done.add(topic)
            print(" ".join(sorted(done)))
        """
    )
    clients = [
        subprocess.Popen(
            [PYTHON, "-c", client_script, str(n), str(state_dir)], stdout=subprocess.PIPE, text=True
        )
        for n in range(4)
    ]
    outputs = [c.communicate(timeout=60)[0] for c in clients]
    assert all(c.returncode == 0 for c in clients)
    assert all(out.count(".released") == 5 for out in outputs), outputs

    running, most = set(), 0
    lines = witness.read_text().split("\n")[:-1]
    for line in lines:
        what, turn_id = line.split()
        if what == "start":
            running.add(turn_id)
        else:
            running.remove(turn_id)
        most = max(most, len(running))
    assert len(lines) == 40 and most == 2

    queued = [t.split(".")[1] for t in log.topics("turn.") if t.endswith(".queued")]
    granted = [t.split(".")[1] for t in log.topics("turn.") if t.endswith(".granted")]
    assert len(queued) == 20 and granted == queued
    assert all(s["state"] == "free" for s in d.client().ps()["slots"])


def _hello_sub(ctx, state_dir, prefix: str):
    """A raw SUB on bus-out, made live with the documented ccsup.hello handshake."""
    sub = ctx.socket(zmq.SUB)
    sub.connect(f"ipc://{state_dir}/bus-out")
    sub.setsockopt(zmq.SUBSCRIBE, prefix.encode())
    hello = f"ccsup.hello.{uuid.uuid4().hex}".encode()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        sub.setsockopt(zmq.SUBSCRIBE, hello)
        if sub.poll(300):
            if sub.recv_multipart()[0] == hello:
                return sub
    pytest.fail("no answer to the hello subscription")


def test_a_sidecar_on_the_bus_alone_gets_its_turn_once(daemon, state_dir):
    daemon()
    ctx = zmq.Context()
    witness = state_dir / "ran"
    turn_id = "sidecar-1"
    body = protocol.dumps(
        {"v": 1, "id": turn_id, "key": "codex", "argv": ["sh", "-c", f"echo x >> {witness}"]}
    )
    try:
        sub = _hello_sub(ctx, state_dir, f"turn.{turn_id}.")
        pub = ctx.socket(zmq.PUB)
        pub.connect(f"ipc://{state_dir}/bus-in")
        topics = []
        while not sub.poll(50):  # a new PUB drops what it sends before it is connected: retry
            pub.send_multipart([b"request.turn", body])
        for _ in range(3):  # a retry after the answer changes nothing
            pub.send_multipart([b"request.turn", body])
        deadline = time.monotonic() + 15
        while not topics or not topics[-1].endswith(".released"):
            assert sub.poll(int((deadline - time.monotonic()) * 1000)), topics
            topics.append(sub.recv_multipart()[0].decode())
        pub.send_multipart(
            [b"request.turn", body]
        )  # a retry after the end is answered by nothing new
        assert not sub.poll(300)
    finally:
        ctx.destroy(linger=0)
    suffixes = [t.rsplit(".", 1)[1] for t in topics]
    assert suffixes == ["queued", "granted", "started", "exited", "gone", "released"]
    assert witness.read_text() == "x\n"


def test_forged_gone_hints_release_nothing_while_a_group_lives(daemon, event_log, state_dir):
    d = daemon(grace="2s")
    log = event_log(d)
    pidfile = state_dir / "child.pid"
    client = d.client()
    # CMD exits only once the child has written its pid, so after its TERM trap is set: a guard
    # that reacts at once to CMD's exit must not catch the child before it is stubborn.
    client.turn(
        "codex",
        stubborn(pidfile, then=f"while [ ! -s {pidfile} ]; do sleep 0.01; done; exit 0"),
        id="t1",
    )
    child = read_pid(pidfile)
    started = log.wait_for("turn.t1.started")
    # CMD is gone (the guard's record says so); its setsid child ignores SIGTERM for the grace
    wait_until(
        lambda: guard_record(state_dir, started)["exit"] is not None,
        what="CMD's exit in the record",
    )
    ctx = zmq.Context()
    try:
        pub = ctx.socket(zmq.PUB)
        pub.connect(f"ipc://{state_dir}/bus-in")
        forged = {"v": 1, "ts": time.time(), "id": "t1", "turn": "t1"}
        for _ in range(10):
            for topic in ("guard.t1.gone", "turn.t1.gone", "turn.t1.released"):
                pub.send_multipart([topic.encode(), protocol.dumps(forged)])
            time.sleep(0.03)
        assert not dead(child)
        assert slot_of(client, "t1")["state"] == "held"
        assert log.find("turn.t1.gone") == [] and log.find("turn.t1.released") == []
    finally:
        ctx.destroy(linger=0)
    log.wait_for("turn.t1.released")
    assert dead(child)
    assert log.topics("turn.t1.").count("turn.t1.gone") == 1
    client.close()


def test_a_guard_killed_outright_has_its_work_ended_before_the_slot_is_released(
    daemon, event_log, state_dir
):
    d = daemon(grace="500ms")
    log = event_log(d)
    pidfile = state_dir / "child.pid"
    client = d.client()
    client.turn("codex", stubborn(pidfile), id="t1")
    child = read_pid(pidfile)
    started = log.wait_for("turn.t1.started")
    # the guard's scan has recorded the child's group before we kill the guard
    wait_until(
        lambda: any(g["pgid"] == child for g in guard_record(state_dir, started)["groups"]),
        what="the child's group in the guard record",
    )
    cmd_pid = guard_record(state_dir, started)["own_group"]["pgid"]
    os.kill(started["guard"]["pid"], signal.SIGKILL)
    exited = log.wait_for("turn.t1.exited")
    assert exited["code"] is None and exited["reason"] == "guard_lost"
    log.wait_for("turn.t1.released")
    assert dead(child) and dead(cmd_pid)
    assert slot_of(client, "t1") is None
    # its record, and the spare it kept beside it (it wrote twice), are removed all the same
    wait_until(lambda: not os.listdir(state_dir / "guards"), what="the guard's files removed")
    client.close()


def test_supervisor_killed_work_ends_and_next_start_finds_every_slot_free(
    daemon, event_log, state_dir
):
    d = daemon(grace="500ms")
    log = event_log(d)
    client = d.client()
    children = start_stubborn_turns(client, state_dir, 2)
    started = [log.wait_for(f"turn.t{n}.started") for n in range(2)]
    cmds = [guard_record(state_dir, s)["own_group"]["pgid"] for s in started]
    client.close()
    log.close()
    d.kill()
    killed_at = time.monotonic()
    wait_until(
        lambda: all(dead(p) for p in children + cmds),
        timeout=0.5 + 2,
        what="every turn's work gone",
    )
    assert time.monotonic() - killed_at < 2.5

    d.start()
    with d.client() as client:
        tallies = wait_until(
            lambda: (lambda ps: None if ps["slots"] else ps["slot_keys"])(client.ps()),
            what="every slot free",
        )
        assert [(t["key"], t["free"]) for t in tallies] == [("codex", 2)]


def test_the_slot_files_of_every_configured_index_are_there_at_start_and_after_a_raise(
    daemon, event_log, state_dir
):
    d = daemon(caps="codex = 2, other = 1")
    log = event_log(d)
    slots = state_dir / "slots"

    def names(key: str) -> list[str]:
        return sorted(os.listdir(slots / key)) if (slots / key).is_dir() else []

    # Made before anything is served: the first grants open them, they create nothing.
    assert names("codex") == ["slot-0.json", "slot-0.lock", "slot-1.json", "slot-1.lock"]
    assert names("other") == ["slot-0.json", "slot-0.lock"]
    with d.client() as client:
        ps = client.ps()
        assert ps["slots"] == []  # free slots are counted per key, not listed
        assert [(t["key"], t["free"]) for t in ps["slot_keys"]] == [("codex", 2), ("other", 1)]
        for n in range(3):  # two run, the third waits
            client.turn("codex", ["sleep", "300"], id=f"t{n}")
        log.wait_for("turn.t1.started")
        log.wait_for("turn.t2.queued")  # may come after t1's start: t2 is asked for after t1
        assert log.topics("turn.t2.") == ["turn.t2.queued"]
        d.config.write_text(d.config.read_text().replace("codex = 2", "codex = 4"))
        client.reload()
        log.wait_for("turn.t2.started")  # granted on the raise
        wait_until(lambda: "slot-3.json" in names("codex"), what="codex#3 made after the raise")
        for n in range(3):
            client.cancel(f"t{n}")
            log.wait_for(f"turn.t{n}.released")


def test_stop_returns_only_when_everything_is_gone(daemon, event_log, state_dir):
    d = daemon(grace="500ms")
    log = event_log(d)
    client = d.client()
    children = start_stubborn_turns(client, state_dir, 2)
    client.turn("codex", ["true"], id="waiter")
    client.close()
    result = subprocess.run(
        [sys.executable, "-m", "supervisor", "--state-dir", str(state_dir), "stop"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert all(dead(p) for p in children)
    assert d.proc.wait(5) == 0
    assert log.find("turn.waiter.cancelled")[0]["reason"] == "shutdown"
    assert [t for t in log.topics("supervisor.") if t != "supervisor.turn_ended"][-2:] == [
        "supervisor.stopping",
        "supervisor.stopped",
    ]


def test_cancel_a_queued_and_a_running_turn(daemon, event_log, state_dir):
    d = daemon(caps="codex = 1", grace="300ms")
    log = event_log(d)
    with d.client() as client:
        client.turn("codex", ["sleep", "300"], id="run")
        assert client.turn("codex", ["true"], id="wait") == {
            "id": "wait",
            "state": "queued",
            "position": 1,
        }
        assert client.cancel("wait")["state"] == "cancelled"
        log.wait_for("turn.run.started")
        assert client.cancel("run")["state"] == "stopping"
        log.wait_for("turn.run.released")
        exited = log.find("turn.run.exited")[0]
        assert story(exited) == {
            "v": 1,
            "id": "run",
            "key": "codex",
            "code": 128 + 15,
            "signal": 15,
            "reason": None,
        }
        assert exited["processes"] == 1 and exited["peak_rss_bytes"] > 0
        assert log.topics("turn.wait.") == ["turn.wait.queued", "turn.wait.cancelled"]
        assert (
            client.cancel("wait")["state"] == "cancelled"
        )  # asking again is answered, not an error


def test_waits_are_per_key_and_time_out_when_asked(daemon, event_log):
    d = daemon(caps="codex = 1, claude = 1")
    log = event_log(d)
    with d.client() as client:
        client.turn("codex", ["sleep", "300"], id="busy")
        client.turn("codex", ["true"], id="impatient", wait_timeout=0.3)
        client.turn("claude", ["true"], id="other")  # a full codex does not block claude
        log.wait_for("turn.other.released")
        assert log.wait_for("turn.impatient.cancelled")["reason"] == "timeout"
        client.cancel("busy")


def test_a_dead_requester_has_its_turns_cancelled(daemon, event_log):
    d = daemon(caps="codex = 1")
    log = event_log(d)
    requester = subprocess.Popen(["sleep", "300"])
    holder = {"session": "s1", "pid": requester.pid}
    with d.client() as client:
        client.turn("codex", ["sleep", "300"], id="running", holder=holder)
        client.turn("codex", ["true"], id="queued", holder=holder)
        log.wait_for("turn.running.started")
        requester.kill()
        requester.wait()
        assert log.wait_for("turn.queued.cancelled")["reason"] == "requester_gone"
        assert log.wait_for("turn.running.stopping")["reason"] == "requester_gone"
        log.wait_for("turn.running.released")


def test_output_is_streamed_with_offsets_and_logged_exactly_and_stdin_can_be_written(
    daemon, event_log, state_dir
):
    d = daemon()
    log = event_log(d)
    with d.client() as client:
        client.turn("codex", ["sh", "-c", "cat; printf 'bye\\377' >&2"], id="io")
        log.wait_for("turn.io.started")
        client.send("io", "hello\n")
        client.send("io", "world\n", eof=True)
        assert log.wait_for("turn.io.exited")["code"] == 0
        log.wait_for("turn.io.released")
    out = "".join(b["data"] for b in log.find("turn.io.stdout"))
    assert out == "hello\nworld\n"
    offsets = [b["offset"] for b in log.find("turn.io.stdout")]
    assert offsets[0] == 0 and offsets == sorted(offsets)
    assert (state_dir / "turns" / "io" / "stderr.log").read_bytes() == b"bye\xff"
    # the guard's record lives only as long as it can tell a reaper anything
    wait_until(lambda: not list((state_dir / "guards").iterdir()), what="the guard record removed")
    # not UTF-8: the exact bytes travel as base64 (see test_output.py for the whole contract)
    assert [b["data_b64"] for b in log.find("turn.io.stderr")] == ["Ynll/w=="]


def test_bad_requests_get_clear_errors_and_change_nothing(daemon, event_log):
    d = daemon()
    with d.client() as client:
        from supervisor.client import RemoteError

        for args, words in [
            ({"key": "a/b", "argv": ["true"]}, "bad 'key'"),
            ({"key": "codex", "argv": []}, "'argv'"),
            ({"key": "codex", "argv": ["true"], "cwd": "/nonexistent"}, "not a directory"),
            ({"key": "codex", "argv": ["true"], "wait_timeout": -1}, "wait_timeout"),
            ({"key": "codex", "argv": ["true"], "id": "../x"}, "'id'"),
        ]:
            with pytest.raises(RemoteError) as err:
                client.call("turn", **args)
            assert words in str(err.value)
        assert client.status()["turns"] == 0 and client.status()["waits"] == 0


def test_the_daemon_raises_its_fd_limit_and_a_turn_gets_the_old_one_back(
    daemon, event_log, state_dir
):
    """500 turns need ~5k fds in the supervisor; a turn's tools (select() breaks above 1024)
    start with the soft limit the daemon was started with."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 256:
        pytest.skip(f"the hard open-file limit ({hard}) leaves nothing to raise")
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))  # the daemon inherits 256
    try:
        d = daemon()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    with open(f"/proc/{d.proc.pid}/limits") as f:
        [line] = [x for x in f if x.startswith("Max open files")]
    if hard != resource.RLIM_INFINITY:
        assert line.split()[3:5] == [str(hard), str(hard)]  # soft raised to the hard limit
    log = event_log(d)
    out = state_dir / "limit.txt"
    client = d.client()
    client.turn(
        "codex",
        ["sh", "-c", f'echo "$(ulimit -Sn) ${{CCSUP_GUARD_NOFILE:-unset}}" > {out}'],
        id="f1",
    )
    assert log.wait_for("turn.f1.exited")["code"] == 0
    log.wait_for("turn.f1.released")
    assert out.read_text().split() == ["256", "unset"]
    client.close()
