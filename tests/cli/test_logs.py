"""`ccsup logs` for people: both streams merged with a marker, one with
--stdout/--stderr, -n/--tail, -f with -t, --key, and a waiting turn that says it waits. Real
supervisors started by `ccsup start`; each turn steps only when the test lets it (a file)."""

from __future__ import annotations

import json
import re
import subprocess

from cli_daemon import CCSUP, ccsup, cli_daemon_fixture  # noqa: F401 (the cli_daemon fixture)
from conftest import wait_until

CONFIG = "[slots]\ncaps = { t = 1 }\n"
STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} "


def run_turn(state_dir, script: str) -> str:
    done = ccsup("run", "--key", "t", "--json", "--", "sh", "-c", script, state_dir=state_dir)
    return json.loads(done.stdout.splitlines()[0])["body"]["id"]


def test_both_streams_merged_in_order_with_a_marker_and_tail(cli_daemon):
    state_dir = cli_daemon(CONFIG)
    # Each write is read apart from the next (a pause between): arrival order is write order.
    turn = run_turn(state_dir, "echo a; sleep 0.2; echo b >&2; sleep 0.2; echo c; printf d >&2")
    merged = ccsup("logs", turn, state_dir=state_dir)
    assert (merged.returncode, merged.stdout) == (0, "out | a\nerr | b\nout | c\nerr | d\n")
    assert ccsup("logs", turn, "--stderr", state_dir=state_dir).stdout == "b\nd"  # exact bytes
    assert ccsup("logs", turn, "-n", "2", state_dir=state_dir).stdout == "out | c\nerr | d\n"
    assert ccsup("logs", turn, "--stdout", "-n", "1", state_dir=state_dir).stdout == "c\n"
    timed = ccsup("logs", turn, "-t", state_dir=state_dir).stdout.splitlines()
    assert [re.sub(STAMP, "", line) for line in timed] == [
        "out | a",
        "err | b",
        "out | c",
        "err | d",
    ]
    assert all(re.match(STAMP, line) for line in timed)


def test_follow_with_timestamps_prints_lines_as_they_come_and_ends_with_the_turn(
    cli_daemon, tmp_path
):
    state_dir = cli_daemon(CONFIG)
    go = tmp_path / "go"
    script = f"echo first; while [ ! -e {go} ]; do sleep 0.05; done; echo second >&2"
    runner = subprocess.Popen(
        [
            *CCSUP,
            "--state-dir",
            str(state_dir),
            "run",
            "--key",
            "t",
            "--json",
            "--",
            "sh",
            "-c",
            script,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert runner.stdout is not None
        turn = json.loads(runner.stdout.readline())["body"]["id"]
        follower = subprocess.Popen(
            [*CCSUP, "--state-dir", str(state_dir), "logs", turn, "-f", "-t"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert follower.stdout is not None
            first = follower.stdout.readline()
            assert re.fullmatch(STAMP + r"out \| first\n", first), first
            go.touch()  # only now does the turn write its second line, then end
            second = follower.stdout.readline()
            assert re.fullmatch(STAMP + r"err \| second\n", second), second
            assert follower.wait(timeout=20) == 0
        finally:
            if follower.poll() is None:
                follower.kill()
                follower.wait()
    finally:
        go.touch()
        runner.wait(timeout=20)


def test_a_waiting_turn_says_it_waits_and_key_follows_the_keys_turns(cli_daemon, tmp_path):
    state_dir = cli_daemon(CONFIG)
    go = tmp_path / "go"
    holder = subprocess.Popen(
        [*CCSUP, "--state-dir", str(state_dir), "run", "--key", "t", "--session", "s1", "--", "sh", "-c",
         f"echo holding; while [ ! -e {go} ]; do sleep 0.05; done"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    waiter = None
    try:

        def ps() -> dict:
            return json.loads(ccsup("ps", "--json", state_dir=state_dir).stdout)

        wait_until(
            lambda: any(s["state"] == "held" for s in ps()["slots"]), what="the first turn held"
        )
        waiter = subprocess.Popen(
            [*CCSUP, "--state-dir", str(state_dir), "run", "--key", "t", "--", "echo", "waited"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(lambda: len(ps()["waits"]) == 1, what="the second turn waiting")
        state = ps()
        waiting = state["waits"][0]["id"]
        holding = next(s["turn"] for s in state["slots"] if s["state"] == "held")
        shown = ccsup("logs", waiting, state_dir=state_dir)
        assert (shown.returncode, shown.stdout) == (0, "")
        assert shown.stderr == f"turn {waiting} is waiting: position 1 of key t, key_full\n"
        wait_until(
            lambda: (
                ccsup("logs", "--key", "t", state_dir=state_dir).stdout
                == f"{holding[:8]} out | holding\n"
            ),
            what="the holder's line under --key",
        )
        by_session = ccsup("logs", "--session", "s1", state_dir=state_dir)
        assert by_session.stdout == f"{holding[:8]} out | holding\n"
        other = ccsup("logs", "--session", "s2", state_dir=state_dir)
        assert (other.returncode, other.stdout) == (0, "")
        assert other.stderr == "no turn of session s2 is running\n"
    finally:
        go.touch()
        holder.wait(timeout=20)
        if waiter is not None:
            waiter.wait(timeout=20)
