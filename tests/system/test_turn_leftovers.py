"""Leftovers named, end to end: a turn whose command exits (or is cancelled) while something it
started still runs publishes `turn.<id>.leftovers`, `show` and the history list it, and `history
--leftovers` sums them per harness and name across turns."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest
from conftest import wait_until

from supervisor.history import db as history

CCSUP = [sys.executable, "-m", "supervisor"]
# What a careless session leaves: a daemon in a session of its own that ignores SIGTERM (as MCP
# servers that outlive their harness do), its argv[0] not something a page may read as HTML.
PLANTED = "<img src=x onerror=alert(1)>"
LEAVES = (
    'setsid bash -c \'trap "" TERM; exec -a "$0" sleep 300\' "$PLANT" '
    "</dev/null >/dev/null 2>&1 & "
    'while [ "$(cat /proc/$!/comm 2>/dev/null)" != sleep ]; do sleep 0.01; done; '
)


def leaving(then: str) -> list[str]:
    return ["bash", "-c", LEAVES + then]


def run(d, key: str, argv: list[str], harness: str | None = None) -> tuple[str, list]:
    turn_id = uuid.uuid4().hex
    with d.client() as client:
        holder = {"session": "s1", "agent": "a1", "harness": harness}
        events = list(client.run_turn(key, argv, id=turn_id, holder=holder, env={"PLANT": PLANTED}))
    return turn_id, events


def ccsup(d, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, CCSUP_STATE_DIR=str(d.state_dir), CCSUP_CONFIG=str(d.config))
    return subprocess.run([*CCSUP, *args], env=env, capture_output=True, text=True, timeout=30)


def in_history(d, turn_id: str) -> dict:
    wait_until(
        lambda: any(
            r["id"] == turn_id and r["leftovers"] for r in history.query(d.state_dir, limit=50)
        ),
        what="the turn's leftovers in the history",
    )
    (record,) = [r for r in history.query(d.state_dir, limit=50) if r["id"] == turn_id]
    return record


@pytest.mark.timeout(120)
def test_what_outlives_its_command_is_named_in_the_event_show_and_history(daemon):
    d = daemon(caps="codex = 2", grace="300ms")
    turn_id, events = run(d, "codex", leaving("exit 0"), harness="codex")
    kinds = [t.rsplit(".", 1)[1] for t, _ in events if not t.endswith((".group", ".stdout"))]
    assert kinds[kinds.index("exited") :] == ["exited", "leftovers", "gone", "released"], kinds
    body = dict(events)[f"turn.{turn_id}.leftovers"]
    assert body["id"] == turn_id and body["count"] == 1
    (named,) = body["names"]
    assert named["name"] == f"{PLANTED} 300" and named["comm"] == "sleep"
    assert named["argv"] == [PLANTED, "300"] and named["pgid"] == named["pid"]
    assert dict(events)[f"turn.{turn_id}.exited"]["code"] == 0
    # ended by the guard: nothing named is still running
    assert (
        not os.path.exists(f"/proc/{named['pid']}")
        or "sleep" not in open(f"/proc/{named['pid']}/comm").read()
    )
    record = in_history(d, turn_id)
    assert record["leftovers"] == {"count": 1, "names": body["names"]}
    shown = ccsup(d, "show", turn_id)
    assert shown.returncode == 0, shown.stderr
    assert "  leftovers  1 (ended by the guard when the command exited)\n" in shown.stdout
    assert f"    {PLANTED} 300  (pid {named['pid']}, group {named['pid']}, ran " in shown.stdout


@pytest.mark.timeout(120)
def test_a_cancelled_turn_names_what_outlived_its_command(daemon, event_log):
    d = daemon(caps="codex = 2", grace="300ms")
    log = event_log(d, ("turn.",))
    turn_id = uuid.uuid4().hex
    with d.client() as client:
        client.turn(
            "codex",
            leaving("echo ready; exec sleep 300"),
            id=turn_id,
            holder={"session": "s1"},
            env={"PLANT": PLANTED},
        )
        log.wait_for(f"turn.{turn_id}.stdout")
        client.cancel(turn_id)
    body = log.wait_for(f"turn.{turn_id}.leftovers")
    assert [n["name"] for n in body["names"]] == [f"{PLANTED} 300"]
    log.wait_for(f"turn.{turn_id}.released")
    assert in_history(d, turn_id)["leftovers"]["count"] == 1


@pytest.mark.timeout(180)
def test_history_leftovers_sums_them_per_harness_and_name(daemon):
    d = daemon(caps="codex = 2, opencode = 2", grace="300ms")
    ids = [run(d, "codex", leaving("exit 0"), harness="codex")[0] for _ in range(3)]
    ids.append(run(d, "opencode:xai", leaving("exit 3"))[0])
    clean, _ = run(d, "codex", ["true"], harness="codex")
    for turn_id in ids:
        in_history(d, turn_id)
    summed = ccsup(d, "history", "--leftovers", "--json")
    assert summed.returncode == 0, summed.stderr
    counts = json.loads(summed.stdout)
    assert [(c["harness"], c["name"], c["times"], c["turns"]) for c in counts] == [
        ("codex", f"{PLANTED} 300", 3, 3),
        ("opencode", f"{PLANTED} 300", 1, 1),
    ]
    only = json.loads(ccsup(d, "history", "--leftovers", "--json", "--key", "opencode:xai").stdout)
    assert [(c["harness"], c["times"]) for c in only] == [("opencode", 1)]
    table = ccsup(d, "history", "--leftovers").stdout.splitlines()
    assert table[0].split() == ["HARNESS", "NAME", "TIMES", "TURNS", "OVER", "FIRST", "LAST"]
    assert table[1].startswith("codex ") and f" {PLANTED} 300 " in table[1]
    none = ccsup(d, "history", "--leftovers", "--key", "nothing-here")
    assert none.stdout == "no turn left anything running when its command exited\n"
    assert [r["leftovers"] for r in history.query(d.state_dir) if r["id"] == clean] == [None]


def test_sum_leftovers_counts_past_the_named_hundred():
    rows = [
        ("k", {"harness": "claude"}, 10.0, {"count": 102, "names": [{"name": "x"}] * 100}),
        ("k", {}, 20.0, {"count": 1, "names": [{"comm": "y"}, "garbage"]}),
        ("k", {}, 30.0, {"count": "bad", "names": None}),
    ]
    assert [(c["harness"], c["name"], c["times"]) for c in history.sum_leftovers(rows)] == [
        ("claude", "x", 100),
        ("claude", history.NOT_NAMED, 2),
        ("k", "y", 1),
    ]
