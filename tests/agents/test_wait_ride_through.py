"""A queued agent's `ccsup wait` and MCP `wait` ride through a SIGKILL of the supervisor and a
start 2 s later: each returns the command's exit status and its whole output,
as `ccsup run` does (tests/client/test_ride_through.py), never "no supervisor is running".

The scenario: a cap of 1, a holder that runs until a file appears, and the agent's command queued
behind it (it prints numbered lines to stdout and stderr, then exits 7). The waiter is started
and seen subscribed (its handshake's hello, seen on the bus: a raw SUB to `ccsup.hello.`), the
supervisor is SIGKILLed, and another is started 2 s later: it restores the queued turn and
adopts the holder. Then the holder is let go, the queued turn runs, and the waiter answers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import zmq
from conftest import wait_until

CCSUP = [sys.executable, "-m", "supervisor"]
LINES = 20
SCRIPT = f"for i in $(seq 1 {LINES}); do echo out $i; echo err $i >&2; done; exit 7"  # its output


class Hellos:
    """Every subscription handshake on the supervisor's bus (the server answers each new
    `ccsup.hello.<nonce>` subscription on that topic): a client seen saying hello is live."""

    def __init__(self, state_dir):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.connect(f"ipc://{state_dir}/bus-out")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # our own subscription's answer: we are live
            self.sock.setsockopt(zmq.SUBSCRIBE, b"ccsup.hello.")
            if self.sock.poll(500) and self.sock.recv_multipart()[0] == b"ccsup.hello.":
                return
        raise AssertionError("the bus never answered our hello")

    def next(self, timeout: float) -> bytes:
        if not self.sock.poll(int(timeout * 1000)):
            raise AssertionError("no client said hello")
        return self.sock.recv_multipart()[0]

    def close(self):
        self.sock.close(linger=0)
        self.ctx.destroy(linger=0)


def queue_behind_a_holder(d, go_file) -> tuple[str, str]:
    with d.client() as client:
        holder = client.turn(
            "default", ["sh", "-c", f"while [ ! -e {go_file} ]; do sleep 0.05; done"]
        )
        queued = client.turn("default", ["sh", "-c", SCRIPT])
    assert queued["state"] == "queued", queued
    return holder["id"], queued["id"]


def history_knows(state_dir, turn_id) -> bool:
    from supervisor.history import db

    try:
        return db.show(state_dir, turn_id) is not None
    except db.HistoryError:
        return False


def expected(stream: str) -> bytes:
    return "".join(f"{stream} {i}\n" for i in range(1, LINES + 1)).encode()


def crash_and_start_again(d, state_dir, go_file) -> None:
    d.kill()
    time.sleep(2.0)  # the scenario's gap (every other wait here is for an event)
    d.start()
    go_file.write_text("")  # the adopted holder ends: the restored turn runs


@pytest.mark.timeout(90)
def test_ccsup_wait_rides_through_a_sigkill_and_a_start_2s_later(daemon, state_dir, tmp_path):
    d = daemon(caps="default = 1", adopt_within="30s")
    go_file = tmp_path / "go"
    _, queued = queue_behind_a_holder(d, go_file)
    hellos = Hellos(state_dir)
    out, err = tmp_path / "wait.out", tmp_path / "wait.err"
    env = dict(os.environ, CCSUP_STATE_DIR=str(state_dir), CCSUP_CONFIG=str(d.config))
    with open(out, "wb") as o, open(err, "wb") as e:
        waiter = subprocess.Popen(
            [*CCSUP, "wait", queued], env=env, stdin=subprocess.DEVNULL, stdout=o, stderr=e
        )
    try:
        hellos.next(20)  # the waiter's subscription is live: it waits
        crash_and_start_again(d, state_dir, go_file)
        code = waiter.wait(60)
    finally:
        hellos.close()
        if waiter.poll() is None:
            waiter.send_signal(signal.SIGKILL)
            waiter.wait()
    assert code == 7, err.read_text()
    assert out.read_bytes() == expected("out")
    assert err.read_bytes() == expected("err")


@pytest.mark.timeout(90)
def test_ccsup_wait_started_while_no_supervisor_runs_waits_for_the_next(
    daemon, state_dir, tmp_path
):
    d = daemon(caps="default = 1", adopt_within="30s")
    go_file = tmp_path / "go"
    _, queued = queue_behind_a_holder(d, go_file)
    # What tells a waiter that a supervisor had the turn: the history holds it (its writer is
    # a thread of the supervisor, a moment behind the answer).
    wait_until(lambda: history_knows(state_dir, queued), what="the history to hold the turn")
    d.kill()
    env = dict(os.environ, CCSUP_STATE_DIR=str(state_dir), CCSUP_CONFIG=str(d.config))
    waiter = subprocess.Popen(
        [*CCSUP, "wait", queued],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        time.sleep(2.0)  # the gap, with the waiter already started in it
        d.start()
        go_file.write_text("")
        stdout, stderr = waiter.communicate(timeout=60)
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait()
    assert waiter.returncode == 7, stderr
    assert (stdout, stderr) == (expected("out"), expected("err"))


@pytest.mark.timeout(120)
def test_mcp_wait_rides_through_a_sigkill_and_a_start_2s_later(daemon, state_dir, tmp_path):
    pytest.importorskip("mcp", reason="the MCP SDK (ccsup[mcp]) is not installed")
    import anyio
    from test_mcp import connected, result

    d = daemon(caps="default = 1", adopt_within="30s")
    go_file = tmp_path / "go"
    _, queued = queue_behind_a_holder(d, go_file)
    env = {
        **os.environ,
        "CCSUP_STATE_DIR": str(state_dir),
        "CCSUP_CONFIG": str(d.config),
        "CCSUP_MCP_BOUND": "10",
    }
    hellos = Hellos(state_dir)
    answers: list[dict] = []

    async def main():
        async with connected(env) as s:
            async with anyio.create_task_group() as tg:

                async def crash():
                    await anyio.to_thread.run_sync(hellos.next, 20)
                    await anyio.to_thread.run_sync(crash_and_start_again, d, state_dir, go_file)

                tg.start_soon(crash)
                answers.append(result(await s.call_tool("wait", {"id": queued})))
            while answers[-1]["state"] != "ended" and len(answers) < 10:
                answers.append(result(await s.call_tool("wait", {"id": queued})))

    try:
        anyio.run(main)
    finally:
        hellos.close()
    end = answers[-1]
    assert (end["state"], end["exit_code"]) == ("ended", 7), answers
    assert end["stdout_tail"] == expected("out").decode()
    assert end["stderr_tail"] == expected("err").decode()


@pytest.mark.timeout(90)
def test_ccsup_wait_with_no_supervisor_back_tells_the_end_its_guard_recorded(
    daemon, state_dir, tmp_path
):
    """No supervisor within adopt_within + 5 s, and the command ended by itself meanwhile: its
    guard's record says how (as `ccsup run` reads it), so wait exits with that, not 71."""
    d = daemon(caps="default = 1", adopt_within="2s")
    go_file = tmp_path / "go"
    with d.client() as client:
        turn = client.turn(
            "default",
            ["sh", "-c", f"while [ ! -e {go_file} ]; do sleep 0.05; done; echo done; exit 5"],
        )["id"]
    hellos = Hellos(state_dir)
    env = dict(os.environ, CCSUP_STATE_DIR=str(state_dir), CCSUP_CONFIG=str(d.config))
    waiter = subprocess.Popen(
        [*CCSUP, "wait", turn],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        hellos.next(20)
        d.kill()
        go_file.write_text("")  # it ends by itself, with no supervisor: its guard records it
        stdout, stderr = waiter.communicate(timeout=60)
    finally:
        hellos.close()
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait()
    assert waiter.returncode == 5, stderr
    assert stdout == b"done\n"


@pytest.mark.timeout(60)
def test_the_hooks_wait_hint_works_in_a_login_shell_that_resets_path(
    daemon, state_dir, tmp_path, monkeypatch
):
    """Codex runs commands in `bash -lc`, whose /etc/profile resets PATH: the line the hook tells
    a queued agent to run (route.wait_hint) needs nothing from PATH, ccsup being only in a venv."""
    from supervisor.agents.route import wait_hint

    d = daemon(caps="default = 1")
    go_file = tmp_path / "go"
    _, queued = queue_behind_a_holder(d, go_file)
    go_file.write_text("")
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("CCSUP_STATE_DIR", str(state_dir))  # the hook's environment
    monkeypatch.setenv("CCSUP_CONFIG", str(d.config))
    hint = wait_hint(queued)  # it carries the state directory: the shell's env need not
    env = {"HOME": str(home), "PATH": "/nonexistent"}
    done = subprocess.run(
        ["/bin/bash", "-lc", f"echo PATH=$PATH >&2; {hint}"],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=50,
        cwd=home,
    )
    said = done.stderr.decode()
    login_path = next(line for line in said.splitlines() if line.startswith("PATH="))
    assert os.path.dirname(sys.executable) not in login_path, said  # ccsup's venv is not on it
    assert done.returncode == 7, done.stderr
    assert done.stdout == expected("out")
