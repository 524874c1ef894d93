"""Clients ride through a supervisor's death: `ccsup run` and Client.run_turn
wait for a supervisor to answer again, follow the turn there, give every byte of its output once
and in order, and exit with its status; with none back in time, `ccsup run` exits 71 and
run_turn raises SupervisorLost.

The supervisor is SIGKILLed (as the OOM killer would) while the turn prints a counter every
50 ms, and started again 1 s later (the gap is the scenario, not a wait for anything: every wait
here is for a line or a file). The counter runs 5 s and is killed at its 10th line, so the new
supervisor (its start takes about a second here) adopts it while it still runs: a turn whose
command ended during the gap is not adopted today (its story ends `supervisor_restarted`, 125).
With `adopt_within = "0s"` the guard ends the work with its supervisor, and the next one tells
that end: `ccsup run` still prints every byte the log has, once, and exits 125."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from conftest import wait_until, write_config, zygote_of

from supervisor.client import Client, TurnOutput
from supervisor.client.ride_through import RETURN_MARGIN, TurnRider
from supervisor.errors import SupervisorLost

CCSUP = [sys.executable, "-m", "supervisor"]
LINES = 100
COUNTER = f"for i in $(seq 1 {LINES}); do echo $i; sleep 0.05; done"
GONE = "is gone; waiting up to"
BACK = "a supervisor answers again"


def start_run(state_dir, config, out, err) -> subprocess.Popen:
    env = dict(os.environ, CCSUP_STATE_DIR=str(state_dir), CCSUP_CONFIG=str(config))
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        return subprocess.Popen(
            [*CCSUP, "run", "--notices", "--key", "codex", "--", "sh", "-c", COUNTER],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
        )


def the_turn(state_dir) -> str:
    return wait_until(lambda: next(iter(os.listdir(state_dir / "turns")), None), what="a turn")


def counted(data: bytes) -> list[int]:
    return [int(line) for line in data.decode().splitlines()]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("adopt_within, zygote_too", [("30s", False), ("30s", True), ("0s", False)])
def test_ccsup_run_rides_through_a_sigkilled_supervisor_started_again_1s_later(
    daemon, state_dir, adopt_within, zygote_too
):
    d = daemon(adopt_within=adopt_within)
    with d.client() as client:
        status = client.status()
    wait_limit = status["adopt_within"] + RETURN_MARGIN
    out, err = state_dir / "run.out", state_dir / "run.err"
    run = start_run(state_dir, d.config, out, err)
    try:
        wait_until(lambda: b"\n10\n" in out.read_bytes(), 20, what="the counter at 10")
        zygote = zygote_of(d.proc.pid) if zygote_too else None
        d.kill()
        if zygote is not None:
            os.kill(zygote, signal.SIGKILL)  # the guard's parent: it changes nothing
        killed_at = time.monotonic()
        wait_until(lambda: GONE in err.read_text(), 10, what="ccsup run saying it waits")
        time.sleep(max(0.0, killed_at + 1.0 - time.monotonic()))  # the scenario's 1 s gap
        d.start()
        code = run.wait(30)
    finally:
        run.kill()
        run.wait()
    turn = the_turn(state_dir)
    log = (state_dir / "turns" / turn / "stdout.log").read_bytes()
    printed = out.read_bytes()
    lines = err.read_text().splitlines()
    assert [line for line in lines if GONE in line] == [
        f"ccsup: the supervisor on {state_dir} (pid {status['pid']}) is gone; waiting up to "
        f"{wait_limit:g} s for one to take turn {turn} back"
    ]
    assert sum(BACK in line for line in lines) == 1, lines
    # Every byte of the log once, in order: the counter from 1 with no line twice or missing.
    assert printed == log
    if adopt_within == "0s":  # the work ended with its supervisor; the next one says so
        assert 10 <= len(counted(printed)) < LINES
        assert code == 125, lines
    else:
        assert counted(printed) == list(range(1, LINES + 1))
        assert code == 0, lines


@pytest.mark.timeout(90)
def test_ccsup_run_exits_71_when_no_supervisor_comes_back_in_time(daemon, state_dir):
    d = daemon(adopt_within="2s")
    with d.client() as client:
        status = client.status()
    wait_limit = status["adopt_within"] + RETURN_MARGIN
    out, err = state_dir / "run.out", state_dir / "run.err"
    run = start_run(state_dir, d.config, out, err)
    try:
        wait_until(lambda: b"\n10\n" in out.read_bytes(), 20, what="the counter at 10")
        d.kill()
        killed_at = time.monotonic()
        code = run.wait(wait_limit + 20)
        took = time.monotonic() - killed_at
    finally:
        run.kill()
        run.wait()
    lines = err.read_text().splitlines()
    assert code == 71, lines
    assert wait_limit - 0.5 <= took <= wait_limit + 3.0, (took, lines)
    assert status["adopt_within"] == 2.0 and f"(pid {status['pid']}) is gone" in lines[0]
    assert "none answered within" in lines[-1] and "not_adopted" in lines[-1], lines
    # What the guard wrote into the logs is printed, each byte once.
    log = (state_dir / "turns" / the_turn(state_dir) / "stdout.log").read_bytes()
    assert out.read_bytes() == log and counted(log)[:10] == list(range(1, 11))


@pytest.mark.timeout(90)
def test_run_turn_rides_through_with_its_output_exact(daemon, state_dir):
    d = daemon(adopt_within="30s")
    restarted = threading.Event()

    def start_again() -> None:
        time.sleep(1.0)  # the scenario's 1 s gap
        d.start()
        restarted.set()

    events, got = [], {"stdout": b"", "stderr": b""}
    with Client(state_dir) as client:
        turn_id = "ride"
        output = TurnOutput(turn_id, fill=lambda s, a, b: client.read_log(turn_id, s, a, b))
        restart = threading.Thread(target=start_again)
        for topic, body in client.run_turn("codex", ["sh", "-c", COUNTER], id=turn_id):
            events.append((topic, body))
            chunk = output.feed(topic, body)
            if chunk is not None:
                got[chunk[0]] += chunk[1]
                if b"\n10\n" in got["stdout"] and not restart.is_alive() and not restarted.is_set():
                    d.kill()
                    restart.start()
        restart.join(30)
    assert restarted.is_set()
    log = (state_dir / "turns" / turn_id / "stdout.log").read_bytes()
    assert got["stdout"] == log and counted(log) == list(range(1, LINES + 1))
    kinds = [topic.rsplit(".", 1)[-1] for topic, _ in events]
    assert [k for k in kinds if k != "stdout"] == [
        *("queued", "granted", "started", "adopted", "exited", "gone", "released")
    ]
    adopted, exited = (body for topic, body in events if topic.endswith((".adopted", ".exited")))
    # adopted went out before anyone could resubscribe: it came from the history
    assert adopted["epoch"] != events[0][1]["epoch"] and adopted["gap_s"] > 0
    assert exited["code"] == 0 and exited["epoch"] == adopted["epoch"]


@pytest.mark.timeout(90)
def test_run_turn_raises_supervisor_lost_when_none_comes_back(daemon, state_dir):
    d = daemon(adopt_within="2s")
    with Client(state_dir) as client:
        wait_limit = client.status()["adopt_within"] + RETURN_MARGIN
        with pytest.raises(SupervisorLost) as lost:
            for topic, _ in client.run_turn("codex", ["sh", "-c", COUNTER], id="lost"):
                if topic.endswith(".stdout") and b"3\n" in client.read_log("lost", "stdout"):
                    if d.proc.poll() is None:
                        d.kill()
                        killed_at = time.monotonic()
        took = time.monotonic() - killed_at
    assert lost.value.exit_code == 71 and "turn lost's end is not known" in lost.value.message
    assert wait_limit - 0.5 <= took <= wait_limit + 3.0


@pytest.mark.timeout(90)
def test_a_queued_ccsup_run_rides_through_and_runs_on_the_next_supervisor(daemon, state_dir):
    d = daemon(caps="codex = 1", adopt_within="30s")
    go = state_dir / "go"
    with d.client() as client:
        client.turn("codex", ["sh", "-c", f'while [ ! -e "{go}" ]; do sleep 0.02; done'], id="hog")
    out, err = state_dir / "run.out", state_dir / "run.err"
    env = dict(os.environ, CCSUP_STATE_DIR=str(state_dir), CCSUP_CONFIG=str(d.config))
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        run = subprocess.Popen(
            [*CCSUP, "run", "--notices", "--key", "codex", "--", "sh", "-c", "echo ran; exit 7"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
        )
    try:
        with d.client() as client:
            wait_until(lambda: len(client.ps()["waits"]) == 1, 20, what="the run queued")
        d.kill()
        wait_until(lambda: GONE in err.read_text(), 10, what="ccsup run saying it waits")
        d.start()  # the queue comes back (queue.json); its requester lives, so it waits on
        go.touch()  # the hog ends (adopted or not), and the run is granted
        code = run.wait(30)
    finally:
        run.kill()
        run.wait()
    assert (code, out.read_bytes()) == (7, b"ran\n"), err.read_text()


@pytest.mark.timeout(90)
def test_ccsup_runs_stdin_goes_on_to_the_next_supervisor_end_of_input_included(daemon, state_dir):
    d = daemon(adopt_within="30s")
    out, err = state_dir / "run.out", state_dir / "run.err"
    env = dict(os.environ, CCSUP_STATE_DIR=str(state_dir), CCSUP_CONFIG=str(d.config))
    echo = 'while read line; do echo "got $line"; done; echo "end of input"'
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        run = subprocess.Popen(
            [*CCSUP, "run", "--notices", "--key", "codex", "--", "sh", "-c", echo],
            env=env,
            stdin=subprocess.PIPE,
            stdout=stdout,
            stderr=stderr,
        )
    try:
        run.stdin.write(b"a\n")
        run.stdin.flush()
        wait_until(lambda: out.read_bytes() == b"got a\n", 20, what="got a")
        d.kill()
        wait_until(lambda: GONE in err.read_text(), 10, what="ccsup run saying it waits")
        run.stdin.write(b"b\n")  # read while no supervisor runs: sent to the next one
        run.stdin.flush()
        d.start()
        wait_until(lambda: BACK in err.read_text(), 20, what="ccsup run following it again")
        wait_until(lambda: out.read_bytes() == b"got a\ngot b\n", 20, what="got b")
        run.stdin.write(b"c\n")
        run.stdin.close()  # the end of input reaches the adopted turn
        code = run.wait(30)
    finally:
        run.kill()
        run.wait()
    assert (code, out.read_bytes()) == (0, b"got a\ngot b\ngot c\nend of input\n"), err.read_text()


@pytest.mark.timeout(90)
def test_ccsup_run_rides_through_ccsup_restart(state_dir):
    from cli_daemon import ccsup

    from guardd import procs

    write_config(state_dir, adopt_within="30s")
    assert ccsup("start", state_dir=state_dir).returncode == 0
    supervisors = []
    try:
        with Client(state_dir) as client:
            supervisors.append(procs.identity_of(client.status()["pid"]))
        out, err = state_dir / "run.out", state_dir / "run.err"
        run = start_run(state_dir, state_dir / "ccsup.toml", out, err)
        try:
            wait_until(lambda: b"\n10\n" in out.read_bytes(), 20, what="the counter at 10")
            restart = ccsup("restart", state_dir=state_dir)
            assert restart.returncode == 0, restart.stderr
            with Client(state_dir) as client:
                supervisors.append(procs.identity_of(client.status()["pid"]))
            code = run.wait(30)
        finally:
            run.kill()
            run.wait()
    finally:
        ccsup("stop", "--timeout", "20", state_dir=state_dir)
        for ident in supervisors:
            if ident is not None and procs.process_running(ident):
                procs.signal_process(ident, signal.SIGKILL)
    log = (state_dir / "turns" / the_turn(state_dir) / "stdout.log").read_bytes()
    assert out.read_bytes() == log and counted(log) == list(range(1, LINES + 1))
    lines = err.read_text().splitlines()
    # It noticed the hand-over and followed the turn on the new supervisor, once each way.
    assert [sum(GONE in line for line in lines), sum(BACK in line for line in lines)] == [1, 1]
    assert code == 0, lines


@pytest.mark.timeout(30)
def test_a_supervisor_killed_again_before_it_answered_ps_is_ridden_through_again(daemon, state_dir):
    # Found by the adoption soak: a supervisor that answered `status` and was killed before it
    # answered the catch-up's `ps`, or before the new subscription, made run_turn (and `ccsup
    # run`) give up ("did not answer 'ps'", NotRunning) while the turn ran on. Now the rider
    # finds it gone and the follower rides through again.
    d = daemon()
    with Client(state_dir, timeout=1.0) as client:
        rider = TurnRider(client, "twice")
        d.kill()
        assert rider.gone()
        d.start()
        assert rider.await_return() is not None
        d.kill()  # killed again, after its `status` answer
        assert rider.catch_up() == []
        assert rider.gone()
        d.start()
        assert rider.await_return() is not None
        d.kill()  # and again, before the subscription (NotRunning used to end the follower)
        assert rider.resubscribe() is None
        assert rider.gone()
        rider.close()


ENDS_BY_ITSELF = "for i in $(seq 1 20); do echo $i; sleep 0.05; done; exit 3"


@pytest.mark.timeout(90)
def test_ccsup_run_with_no_supervisor_back_exits_with_the_status_its_guard_recorded(
    daemon, state_dir
):
    """The command ended by itself in the gap (at line 20, exit 3) and no supervisor came back:
    the guard's record tells its status, and every byte of its log is printed once."""
    d = daemon(adopt_within="2s")
    out, err = state_dir / "run.out", state_dir / "run.err"
    env = dict(os.environ, CCSUP_STATE_DIR=str(state_dir), CCSUP_CONFIG=str(d.config))
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        run = subprocess.Popen(
            [*CCSUP, "run", "--notices", "--key", "codex", "--", "sh", "-c", ENDS_BY_ITSELF],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
        )
    try:
        wait_until(lambda: b"\n3\n" in out.read_bytes(), 20, what="the counter at 3")
        d.kill()
        code = run.wait(40)
    finally:
        run.kill()
        run.wait()
    lines = err.read_text().splitlines()
    assert code == 3, lines
    assert "is read from its files" in lines[-1] and "not known" not in err.read_text(), lines
    assert out.read_bytes() == "".join(f"{i}\n" for i in range(1, 21)).encode()


@pytest.mark.timeout(90)
def test_run_turn_with_no_supervisor_back_yields_the_end_its_guard_recorded(daemon, state_dir):
    d = daemon(adopt_within="2s")
    events = []
    with Client(state_dir) as client:
        for topic, body in client.run_turn("codex", ["sh", "-c", ENDS_BY_ITSELF], id="byself"):
            events.append((topic, body))
            if topic.endswith(".stdout") and d.proc.poll() is None:
                d.kill()
    kinds = [topic.rsplit(".", 1)[-1] for topic, _ in events if not topic.endswith(".stdout")]
    assert kinds[-2:] == ["exited", "released"], kinds
    exited = events[-2][1]
    assert (exited["code"], exited["signal"], exited["inferred"]) == (3, None, True)
    assert exited["exited_at"] > events[0][1]["ts"]


@pytest.mark.timeout(120)
def test_a_queued_ccsup_run_outliving_the_gap_says_so_and_waits_to_run(daemon, state_dir):
    """No supervisor within adopt_within + 5 s: a queued turn is told "queued, still waiting",
    its `ccsup run` waits on (so it is not cancelled requester_gone), and it runs on the next."""
    d = daemon(caps="codex = 1", adopt_within="1s")
    with d.client() as client:
        client.turn("codex", ["sleep", "60"], id="hog")
    out, err = state_dir / "run.out", state_dir / "run.err"
    env = dict(os.environ, CCSUP_STATE_DIR=str(state_dir), CCSUP_CONFIG=str(d.config))
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        run = subprocess.Popen(
            [*CCSUP, "run", "--notices", "--key", "codex", "--", "sh", "-c", "echo ran; exit 7"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
        )
    try:
        with d.client() as client:
            wait_until(lambda: len(client.ps()["waits"]) == 1, 20, what="the run queued")
        d.kill()
        wait_until(lambda: "queued, still waiting" in err.read_text(), 30, what="queued, waiting")
        assert run.poll() is None, err.read_text()
        d.start()  # the hog's guard ended it (not_adopted); the run is granted
        code = run.wait(30)
    finally:
        run.kill()
        run.wait()
    assert (code, out.read_bytes()) == (7, b"ran\n"), err.read_text()
