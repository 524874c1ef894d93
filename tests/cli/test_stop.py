"""`ccsup stop`: it says what it ended, and `--drain` grants nothing new,
takes no new turn, lets the running turns finish on their own, then stops (cancelling the
turns still waiting). Real supervisors; the running turn ends when the test lets it."""

from __future__ import annotations

import json
import subprocess

from cli_daemon import CCSUP, ccsup, cli_daemon_fixture  # noqa: F401 (the cli_daemon fixture)
from conftest import wait_until


def test_stop_drain_lets_the_running_turn_finish_and_grants_nothing_new(cli_daemon, tmp_path):
    state_dir = cli_daemon("[slots]\ncaps = { t = 1 }\n")
    go = tmp_path / "go"
    base = [*CCSUP, "--state-dir", str(state_dir), "run", "--key", "t", "--"]
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    running = subprocess.Popen(
        [*base, "sh", "-c", f"while [ ! -e {go} ]; do sleep 0.05; done; exit 7"], **quiet
    )
    waiter = None
    stopper = None
    try:

        def ps() -> dict:
            return json.loads(ccsup("ps", "--json", state_dir=state_dir).stdout)

        wait_until(lambda: any(s["state"] == "held" for s in ps()["slots"]), what="a held slot")
        waiter = subprocess.Popen([*base, "echo", "never"], **quiet)
        wait_until(lambda: len(ps()["waits"]) == 1, what="the second turn waiting")
        stopper = subprocess.Popen(
            [*CCSUP, "--state-dir", str(state_dir), "stop", "--drain"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert stopper.stderr is not None
        assert stopper.stderr.readline() == "draining: waiting for 1 running turn(s) to end\n"
        # Draining: the running turn goes on, the waiter is not granted, a new turn is refused.
        refused = ccsup("run", "--key", "t", "--", "true", state_dir=state_dir)
        assert refused.returncode != 0 and "stopping" in refused.stderr, refused.stderr
        assert running.poll() is None and waiter.poll() is None and stopper.poll() is None
        assert len(ps()["waits"]) == 1
        go.touch()  # only now may the running turn end
        assert running.wait(timeout=20) == 7  # it finished on its own: its own status
        out, _ = stopper.communicate(timeout=30)
        assert stopper.returncode == 0
        assert out == (
            f"ccsup stopped (state {state_dir}): 1 running turn(s) finished while draining (t 1); "
            "1 waiting cancelled\n"
        )
        assert waiter.wait(timeout=20) == 69  # cancelled by the shutdown, never run
    finally:
        go.touch()
        for proc in (running, waiter, stopper):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


def test_stop_says_nothing_was_running(cli_daemon):
    state_dir = cli_daemon()
    done = ccsup("stop", state_dir=state_dir)
    assert (done.returncode, done.stdout) == (
        0,
        f"ccsup stopped (state {state_dir}): nothing was running\n",
    )
