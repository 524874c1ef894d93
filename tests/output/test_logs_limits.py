"""[logs] under a real supervisor: a turn's logs stop at turn_max_bytes (the guard drops the rest,
so the bus, which follows the logs, stops there too),
pruning at start leaves running turns alone, `ccsup logs` says when logs were pruned and
`ccsup logs -t` prints arrival times from the index (the log's bytes unchanged)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from conftest import story, wait_until

from supervisor.client import TurnOutput
from supervisor.output import line_times

LIMIT = 10_000


def ccsup(state_dir, *args):
    return subprocess.run(
        [sys.executable, "-m", "supervisor", "--state-dir", str(state_dir), *args],
        capture_output=True,
        timeout=30,
    )


@pytest.mark.timeout(60)
def test_past_turn_max_bytes_the_log_and_the_bus_stop_and_truncated_says_where(daemon, state_dir):
    d = daemon(extra=f"[logs]\nturn_max_bytes = {LIMIT}\n")
    # 6000 bytes of stdout; then, once they were seen, 6000 of stderr: the limit falls in those.
    script = (
        "head -c 6000 /dev/zero | tr '\\0' a; read go; "
        "head -c 6000 /dev/zero | tr '\\0' b >&2; read go; echo end"
    )
    out, events = TurnOutput("big"), []
    with d.client() as client, client.subscribe(["turn.big."]) as sub:
        sub.expect_turn("big")
        client.turn("codex", ["sh", "-c", script], id="big")
        for topic, body in sub.until_terminal(idle_check=client.check_running):
            events.append((topic, body))
            got = out.feed(topic, body)
            if got and got[0] == "stdout" and out.position["stdout"] == 6000:
                client.send("big", "go\n")
            if got and got[0] == "stderr" and out.position["stderr"] == LIMIT - 6000:
                client.send("big", "go\n")  # "end" only once the limit was reached
    assert out.position == {"stdout": 6000, "stderr": LIMIT - 6000}  # what the logs hold
    (truncated,) = [b for t, b in events if t == "turn.big.truncated"]
    assert story(truncated) == {
        "v": 1,
        "id": "big",
        "stream": "stderr",
        "offset": LIMIT - 6000,
        "limit": LIMIT,
    }
    turn_dir = state_dir / "turns" / "big"
    stdout, stderr = (turn_dir / "stdout.log").read_bytes(), (turn_dir / "stderr.log").read_bytes()
    assert stdout == b"a" * 6000 and stderr == b"b" * (LIMIT - 6000)  # "end" came after the limit
    assert [t.rsplit(".", 1)[1] for t, _ in events][-3:] == ["exited", "gone", "released"]


@pytest.mark.timeout(60)
def test_prune_at_start_spares_nothing_old_but_a_running_turn_and_logs_says_pruned(
    daemon, state_dir
):
    old = time.time() - 30 * 86400
    for turn_id in ("ancient", "ancient2"):
        path = state_dir / "turns" / turn_id
        path.mkdir(parents=True)
        (path / "stdout.log").write_bytes(b"old output\n")
        os.utime(path / "stdout.log", (old, old))
    d = daemon(extra='[logs]\nkeep = "7d"\n')
    wait_until(
        lambda: sorted(os.listdir(state_dir / "turns" / "ancient")) == ["pruned.json"],
        what="the old logs pruned at start",
    )
    shown = ccsup(state_dir, "logs", "ancient")
    assert shown.returncode == 1
    assert b"turn ancient: its logs were pruned at " in shown.stderr and b"(keep)" in shown.stderr
    with d.client() as client:
        list(client.run_turn("codex", ["echo", "fresh"], id="fresh"))
    assert ccsup(state_dir, "logs", "fresh", "--stdout").stdout == b"fresh\n"


@pytest.mark.timeout(60)
def test_logs_t_prints_each_line_with_its_time_and_the_log_is_untouched(daemon, state_dir):
    d = daemon()
    # Each write waits for the test to have seen the previous one: three reads, three times.
    script = "echo one; read a; printf 'two\\nthr'; read b; echo ee"
    out = TurnOutput("timed")
    with d.client() as client, client.subscribe(["turn.timed."]) as sub:
        sub.expect_turn("timed")
        client.turn("codex", ["sh", "-c", script], id="timed")
        for topic, body in sub.until_terminal(idle_check=client.check_running):
            if out.feed(topic, body) and out.position["stdout"] in (4, 11):
                client.send("timed", "next\n")
    turn_dir = state_dir / "turns" / "timed"
    assert (turn_dir / "stdout.log").read_bytes() == b"one\ntwo\nthree\n"
    entries = line_times.read_index(turn_dir / "stdout.idx")
    assert [o for o, _ in entries] == [0, 4, 11]
    shown = ccsup(state_dir, "logs", "-t", "--stdout", "timed")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert [line[24:] for line in lines] == [b"one", b"two", b"three"]
    stamps = [line[:24] for line in lines]
    assert stamps == [line_times.stamp(entries[i][1]) for i in (0, 1, 1)]
    assert entries[0][1] <= entries[1][1] <= entries[2][1]
    # A silent stream has a log and no index (made at its first read): one file fewer a turn.
    assert (turn_dir / "stderr.log").read_bytes() == b""
    assert not (turn_dir / "stderr.idx").exists()
    assert ccsup(state_dir, "logs", "-t", "--stderr", "timed").stdout == b""
