"""Admission in a running supervisor: pauses (control, bus, pause_on), start rates, runtime
limits and session fairness, end to end with real turns."""

from __future__ import annotations

import json
import time
from pathlib import Path

import zmq
from conftest import wait_until

from supervisor.wire import protocol


def hold_until(path) -> list[str]:
    """A turn that runs until `path` exists (the test's handshake, never a fixed sleep)."""
    return ["sh", "-c", f'while [ ! -e "{path}" ]; do sleep 0.02; done']


def granted_order(log, ids) -> list[str]:
    topics = [t for t in log.topics("turn.") if t.endswith(".granted")]
    return [t.split(".")[1] for t in topics if t.split(".")[1] in ids]


def test_a_pause_holds_three_waiters_until_its_end_then_they_run_in_order(daemon, event_log):
    d = daemon(caps="codex = 1")
    log = event_log(d)
    with d.client() as client:
        paused = client.pause("codex", for_=1.5, reason="429 from the provider")
        assert paused["changed"] and not paused["capped"]
        assert paused["reason"] == "429 from the provider" and paused["by"] == "control"
        body = log.wait_for("key.codex.paused")
        assert body["until"] == paused["until"] and body["by"] == "control"
        for i in range(3):
            assert client.turn("codex", ["true"], id=f"t{i}")["state"] == "queued"
        ps = client.ps()
        assert [w["why"]["reason"] for w in ps["waits"]] == ["paused", "behind", "behind"]
        assert [w["why"]["until"] for w in ps["waits"]] == [paused["until"]] * 3
        assert ps["keys"][0]["key"] == "codex"
        assert ps["keys"][0]["paused"]["until"] == paused["until"]
        assert client.status()["keys"][0]["paused"]["until"] == paused["until"]
        assert log.wait_for("key.codex.resumed") == {**log.find("key.codex.resumed")[0]}
        assert log.find("key.codex.resumed")[0]["reason"] == "expired"
        for i in range(3):
            log.wait_for(f"turn.t{i}.released")
    assert granted_order(log, {"t0", "t1", "t2"}) == ["t0", "t1", "t2"]
    assert log.time_of("turn.t0.granted") >= log.time_of("key.codex.resumed")
    assert log.topics("key.") == ["key.codex.paused", "key.codex.resumed"]


def test_resume_ends_a_pause_early_and_a_bare_harness_pauses_its_keys(daemon, event_log):
    d = daemon(caps="opencode = 1")
    log = event_log(d)
    with d.client() as client:
        client.pause("opencode", for_=60)
        client.turn("opencode:xai", ["true"], id="x1")
        assert client.ps()["waits"][0]["why"]["reason"] == "paused"
        answer = client.resume("opencode", reason="quota reset")
        assert answer["resumed"] == ["opencode"] and answer["still_paused"] is None
        assert log.wait_for("key.opencode.resumed")["reason"] == "quota reset"
        log.wait_for("turn.x1.released")
        assert client.resume("opencode")["resumed"] == []


def test_a_bus_pause_from_a_bare_pub_is_answered_once_per_id(daemon, event_log, state_dir):
    d = daemon(caps="codex = 1")
    log = event_log(d, prefixes=("key.",))
    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.PUB)
    pub.connect(f"ipc://{state_dir}/bus-in")
    try:

        def send(body):
            frames = [b"request.pause", protocol.dumps({"v": 1, "ts": time.time(), **body})]
            pub.send_multipart(frames)

        body = {"id": "p1", "key": "codex", "for": 30, "reason": "429"}
        deadline = time.monotonic() + 10
        while not log.find("key.codex.paused"):  # a fresh PUB drops what it sends before it joins
            assert time.monotonic() < deadline, "no key.codex.paused"
            send(body)
            time.sleep(0.05)
        send(body)  # the same id again: answered already, nothing changes
        send({"id": "marker", "key": "claude", "for": 30})  # ordered after the repeat
        log.wait_for("key.claude.paused")
    finally:
        pub.close(linger=0)
    assert log.topics("key.codex.") == ["key.codex.paused"]
    paused = log.find("key.codex.paused")[0]
    assert paused["by"] == "bus" and paused["reason"] == "429"
    with d.client() as client:
        assert [p["key"] for p in client.ps()["keys"] if p["paused"]] == ["claude", "codex"]


def test_max_pause_caps_a_long_pause(daemon):
    d = daemon(caps="codex = 1", extra='max_pause = "2s"')
    with d.client() as client:
        before = time.time()
        answer = client.pause("codex", until=before + 7 * 86400)
        assert answer["capped"] and before + 2 <= answer["until"] <= time.time() + 2


def test_a_restart_keeps_a_pause_and_drops_an_expired_one(daemon, event_log):
    d = daemon(caps="codex = 1")
    with d.client() as client:
        long = client.pause("codex", for_=600, reason="long")
        short = client.pause("claude", for_=0.3, reason="short")
    assert d.stop() == 0
    wait_until(lambda: time.time() > short["until"], what="the short pause to end")
    d.start()
    log = event_log(d)
    with d.client() as client:
        keys = {k["key"]: k["paused"] for k in client.ps()["keys"]}
        assert keys == {"codex": {**{k: long[k] for k in ("key", "until", "reason", "by")},
                                  "since": long["since"]}}  # fmt: skip
        client.turn("codex", ["true"], id="held")
        assert client.ps()["waits"][0]["why"]["reason"] == "paused"
        client.resume("codex")
        log.wait_for("turn.held.released")
    assert "key.claude.resumed" not in log.topics()


def test_a_start_rate_of_3_per_2s_is_never_exceeded_and_keeps_request_order(
    daemon, event_log, state_dir
):
    d = daemon(caps="codex = 10", extra='rates = { codex = "3/2s" }')
    log = event_log(d)
    starts = state_dir / "starts"
    with d.client() as client:
        for i in range(10):
            script = f'echo "{i} $EPOCHREALTIME" >> {starts}; sleep 0.1'
            client.turn("codex", ["bash", "-c", script], id=f"r{i}")
        ps = client.ps()
        assert ps["waits"][0]["why"]["reason"] == "rate"
        assert ps["keys"][0]["next_grant"] == ps["waits"][0]["why"]["until"]
        for i in range(10):
            log.wait_for(f"turn.r{i}.released", timeout=20)
    assert granted_order(log, {f"r{i}" for i in range(10)}) == [f"r{i}" for i in range(10)]
    times = sorted(float(line.split()[1]) for line in starts.read_text().splitlines())
    assert len(times) == 10
    gaps = [round(times[i + 3] - times[i], 3) for i in range(len(times) - 3)]
    started = [log.find(f"turn.r{i}.started")[0]["ts"] for i in range(10)]
    sgaps = [round(started[i + 3] - started[i], 3) for i in range(7)]
    assert min(gaps) >= 2.0, (gaps, sgaps)  # no 4 starts within any 2 s


def test_a_turn_past_its_timeout_is_stopped_with_all_it_started_after_expiring(
    daemon, event_log, state_dir
):
    d = daemon(caps="codex = 1", extra='expiring_notice = "500ms"')
    log = event_log(d)
    pids = state_dir / "pids"
    script = (
        f"sleep 300 & echo $! >> {pids}; "
        f"(setsid sh -c 'echo $$ >> {pids}; exec sleep 300' &); echo $$ >> {pids}; wait"
    )
    with d.client() as client:
        client.call("turn", key="codex", argv=["sh", "-c", script], id="slow", timeout=1.5)
        expiring = log.wait_for("turn.slow.expiring")
        exited = log.wait_for("turn.slow.exited")
        log.wait_for("turn.slow.released")
    assert expiring["limit"] == 1.5 and expiring["source"] == "timeout"
    assert exited["reason"] == "timeout"
    topics = log.topics("turn.slow.")
    assert topics.index("turn.slow.expiring") < topics.index("turn.slow.stopping")
    assert log.find("turn.slow.stopping")[0]["reason"] == "timeout"
    recorded = list(map(int, pids.read_text().split()))
    assert len(recorded) == 3  # the shell, its child, and a setsid grandchild in its own session
    for pid in recorded:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:  # gone (or going while it was read)
            continue
        assert ") Z " in stat


def test_max_runtime_of_the_bare_harness_applies_when_smaller(daemon, event_log):
    d = daemon(caps="codex = 1", extra='max_runtime = { codex = "1s" }\nexpiring_notice = "2s"')
    log = event_log(d)
    with d.client() as client:
        client.call("turn", key="codex:o3", argv=["sleep", "300"], id="long", timeout=60)
        assert log.wait_for("turn.long.expiring")["source"] == "max_runtime"
        assert log.wait_for("turn.long.exited")["reason"] == "timeout"
        log.wait_for("turn.long.released")


def test_session_fairness_grants_a_second_session_before_the_third_of_the_first(
    daemon, event_log, state_dir
):
    d = daemon(caps="codex = 1", extra='fairness = "session"')
    log = event_log(d)
    go = state_dir / "go"
    with d.client() as client:
        a = {"session": "orchestrator"}
        client.turn("codex", hold_until(go), id="a1", holder=a)
        log.wait_for("turn.a1.started")
        client.turn("codex", ["true"], id="a2", holder=a)
        client.turn("codex", ["true"], id="a3", holder=a)
        client.turn("codex", ["true"], id="b1", holder={"session": "person"})
        waits = client.ps()["waits"]
        assert [w["id"] for w in waits] == ["b1", "a2", "a3"]
        assert [w["why"]["reason"] for w in waits] == ["key_full", "behind", "behind"]
        assert waits[2]["why"]["detail"].startswith("2 waiters of the key ahead; the head waits")
        go.touch()
        for turn_id in ("a2", "a3", "b1"):
            log.wait_for(f"turn.{turn_id}.released")
    assert granted_order(log, {"a1", "a2", "a3", "b1"}) == ["a1", "b1", "a2", "a3"]


def test_a_turn_that_prints_a_429_pauses_its_key_for_its_retry_after(daemon, event_log):
    rule = '[pause_on.codex]\nstderr = "(?i)rate.?limit|429"\nfor = "60s"\n'
    d = daemon(caps="codex = 1", extra="\n" + rule)
    log = event_log(d)
    # a byte that is not UTF-8 first: that chunk travels as data_b64 and is matched all the same
    script = (
        "printf '\\377' >&2; echo 'HTTP 429 Too Many Requests' >&2; echo 'Retry-After: 7' >&2;"
        " exit 1"
    )
    with d.client() as client:
        client.turn("codex", ["sh", "-c", script], id="hit")
        client.turn("codex", ["true"], id="next")
        # the 429 line pauses the key at once; when its Retry-After comes in a later chunk, a
        # second paused event sets the end from it
        wait_until(
            lambda: any("Retry-After" in b["reason"] for b in log.find("key.codex.paused")),
            what="a pause that says Retry-After",
        )
        paused = log.find("key.codex.paused")[-1]
        log.wait_for("turn.hit.released")
        assert paused["by"] == "pause_on:hit" and "(Retry-After: 7)" in paused["reason"]
        assert 6 <= paused["until"] - paused["since"] <= 7.5
        assert client.ps()["waits"][0]["why"]["reason"] == "paused"
        assert "turn.next.granted" not in log.topics()
        client.resume("codex")
        log.wait_for("turn.next.released")


def test_an_exit_code_listed_in_pause_on_pauses_the_key(daemon, event_log):
    d = daemon(caps="codex = 1", extra='\n[pause_on.codex]\nexit_codes = [75]\nfor = "30s"\n')
    log = event_log(d)
    with d.client() as client:
        client.turn("codex", ["sh", "-c", "exit 75"], id="busy")
        paused = log.wait_for("key.codex.paused")
        assert paused["reason"] == "pause_on: exit code 75" and paused["by"] == "pause_on:busy"
        assert 29 <= paused["until"] - paused["since"] <= 30.5


def test_admission_json_corrupt_is_moved_aside_and_reported(daemon, event_log, state_dir):
    (state_dir / "admission.json").write_text("{not json")
    d = daemon(caps="codex = 1", start=False)
    d.start()
    with d.client() as client:
        assert client.ps()["keys"] == []
    aside = [p.name for p in state_dir.iterdir() if p.name.startswith("admission.json.bad-")]
    assert len(aside) == 1
    assert json.loads((state_dir / "admission.json").read_text())["pauses"]["pauses"] == []


def test_a_slow_pattern_runs_off_the_loop_and_the_key_waits_for_its_verdict(daemon, event_log):
    # (x+x+)+y backtracks for a while on 22 x's (0.15 s on a quiet machine, 1 s at a load of 20 on
    # 2 cores; the matcher's own limit is 5 s): the scan is slow on purpose.
    rule = '[pause_on.codex]\nstderr = "(x+x+)+y|429"\nfor = "30s"\n'
    d = daemon(caps="codex = 1", extra="\n" + rule)
    log = event_log(d)
    script = "echo xxxxxxxxxxxxxxxxxxxxxx >&2; echo 429 >&2"
    with d.client() as client:
        client.turn("codex", ["sh", "-c", script], id="hit")
        client.turn("codex", ["true"], id="next")
        log.wait_for("turn.hit.released")
        started = time.monotonic()
        ps = client.ps()  # the supervisor answers while the pattern runs
        assert time.monotonic() - started < 2.0
        assert ps["waits"][0]["why"]["reason"] in ("checking_output", "paused")
        paused = log.wait_for("key.codex.paused")
        assert paused["by"] == "pause_on:hit"
        assert "turn.next.granted" not in log.topics()
        client.resume("codex")
        log.wait_for("turn.next.released")


def test_ccsup_pause_and_resume_from_the_shell(daemon, state_dir):
    import subprocess
    import sys

    d = daemon(caps="codex = 1")

    def ccsup(*args):
        return subprocess.run(
            [sys.executable, "-m", "supervisor", "--state-dir", str(state_dir), *args],
            capture_output=True,
            text=True,
            timeout=20,
        )

    done = ccsup("pause", "codex", "--for", "90s", "--reason", "429", "--json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["key"] == "codex" and answer["reason"] == "429" and answer["changed"]
    # opencode is neither configured nor ever run here: refused unless forced
    assert ccsup("pause", "opencode", "--until", "2099-12-01T10:00").returncode == 2
    until = ccsup("pause", "opencode", "--until", "2099-12-01T10:00", "--force")
    assert until.returncode == 0 and "longer than [slots] max_pause (1h00m)" in until.stdout
    assert ccsup("pause", "codex").returncode == 2  # neither --for nor --until
    assert ccsup("pause", "codex", "--for", "soon").returncode == 2
    assert ccsup("pause", "_machine", "--for", "1s").returncode == 2
    with d.client() as client:
        client.turn("codex", ["true"], id="w")
    ps = ccsup("ps")
    waiter = next(x for x in ps.stdout.splitlines() if x.split()[:2] == ["1", "w"])
    assert "codex paused until" in ps.stdout and "paused until" in waiter  # its WHY
    assert "codex paused until" in ccsup("status").stdout
    resumed = ccsup("resume", "codex")
    assert resumed.returncode == 0 and resumed.stdout == "resumed codex\n"
    assert ccsup("resume", "codex").stdout == "codex was not paused\n"


def test_session_fairness_gives_a_late_session_no_credit_for_rounds_it_missed(
    daemon, event_log, state_dir
):
    d = daemon(caps="codex = 1", extra='fairness = "session"')
    log = event_log(d)
    go1, go2 = state_dir / "go1", state_dir / "go2"
    a, b = {"session": "A"}, {"session": "B"}
    with d.client() as client:
        client.turn("codex", hold_until(go1), id="a1", holder=a)
        client.turn("codex", hold_until(go2), id="a2", holder=a)
        client.turn("codex", ["true"], id="a3", holder=a)
        client.turn("codex", ["true"], id="a4", holder=a)
        go1.touch()
        log.wait_for("turn.a2.started")  # round 1 is being served when B arrives
        client.turn("codex", ["true"], id="b1", holder=b)
        client.turn("codex", ["true"], id="b2", holder=b)
        assert [w["id"] for w in client.ps()["waits"]] == ["b1", "a3", "b2", "a4"]
        go2.touch()
        for turn_id in ("a3", "a4", "b1", "b2"):
            log.wait_for(f"turn.{turn_id}.released")
    ids = {"a1", "a2", "a3", "a4", "b1", "b2"}
    assert granted_order(log, ids) == ["a1", "a2", "b1", "a3", "b2", "a4"]


def test_the_python_client_publishes_a_pause_and_gets_its_own_answer(daemon):
    d = daemon(caps="codex = 1")
    with d.client() as client:
        client.pause("codex", for_=60, reason="someone else's")
        answer = client.publish_pause("codex", id="mine", for_=5, reason="429")
        assert answer["id"] == "mine" and answer["changed"] is False
        assert answer["reason"] == "someone else's"  # the key stays paused by the longer pause
        longer = client.publish_pause("codex", id="longer", for_=120, reason="429")
        assert longer["changed"] and longer["reason"] == "429" and longer["by"] == "bus"


def test_the_current_rate_window_survives_a_restart(daemon, event_log):
    d = daemon(caps="codex = 2", extra='rates = { codex = "2/30s" }')
    log = event_log(d)
    with d.client() as client:
        for i in range(2):
            client.turn("codex", ["true"], id=f"w{i}")
        for i in range(2):
            log.wait_for(f"turn.w{i}.released")
        before = client.ps()["keys"]
    assert [k["key"] for k in before] == ["codex"] and before[0]["next_grant"] is not None
    assert d.stop() == 0
    d.start()
    with d.client() as client:
        client.turn("codex", ["true"], id="after")
        ps = client.ps()
        assert ps["waits"][0]["why"]["reason"] == "rate"
        assert ps["waits"][0]["why"]["until"] == before[0]["next_grant"]
        client.cancel("after")
