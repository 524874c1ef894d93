"""Restarts lose nothing: queue.json brings back what was acknowledged, bad files are moved aside."""

from __future__ import annotations

import json
import subprocess
import time

from conftest import PYTHON, wait_until

from supervisor.turns import store

HOLDER = {"session": "s1", "agent": "a1"}


def queue_file(state_dir) -> dict:
    """What queue.json and its journal hold together."""
    return store.read_queue(state_dir / "queue.json")


# Holds the codex slot from outside the supervisor (the gate is a library any local program may
# use), once the killed supervisor's turn has let go of it, until told to release.
HOLD_CODEX = r"""
import sys, time
from pathlib import Path
from supervisor.caps import Caps
from supervisor.slots.gate import Holder, SlotGate
gate = SlotGate(Path(sys.argv[1]), Caps(caps={"codex": 1}))
deadline = time.monotonic() + 20
holder = Holder.this_process(agent="outside")
while (slot := gate.try_acquire("codex", holder, turn="outside")) is None:
    if time.monotonic() > deadline:
        sys.exit(3)
    time.sleep(0.02)
print("held", flush=True)
sys.stdin.readline()
slot.release()
"""


def test_waiting_turns_and_reservations_come_back_in_order_after_a_sigkill(
    daemon, event_log, state_dir
):
    d = daemon(caps="codex = 1, claude = 1", extra='reservation_ttl = "60s"')
    witness = state_dir / "order"
    with d.client() as client:
        client.turn("codex", ["sleep", "300"], id="busy")
        client.reserve("claude", holder=HOLDER, id="held")
        for n in range(3):
            client.turn(
                "codex", ["sh", "-c", f"echo w{n} >> {witness}"], id=f"w{n}", env={"TOKEN": "x"}
            )
        client.reserve("codex", holder=HOLDER, id="rq")
        # busy's command runs (else, granted but not started, it is held for its requester
        # after the restart: supervisor.turns.rerun)
        wait_until(lambda: (_guard_record(state_dir, "busy") or {}).get("own_group"), what="CMD")
    saved = queue_file(state_dir)
    assert [w["id"] for w in saved["waiting"]] == ["w0", "w1", "w2"]
    assert (state_dir / "queue.json").stat().st_mode & 0o777 == 0o600
    d.kill()
    # busy's guard ends its work when its parent dies; then an outside holder takes the slot, so
    # the restarted supervisor can grant nothing of codex and must show every waiter, in order.
    outside = subprocess.Popen(
        [PYTHON, "-c", HOLD_CODEX, str(state_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert outside.stdout.readline() == "held\n"
        d.start()
        log = event_log(d)
        with d.client() as client:
            ps = client.ps()
            assert [w["id"] for w in ps["waits"]] == ["w0", "w1", "w2", "rq"]
            slots = {s["key"]: (s["state"], s["turn"]) for s in ps["slots"]}
            assert slots == {"codex": ("reserved", "outside"), "claude": ("reserved", None)}
            outside.stdin.write("release\n")
            outside.stdin.flush()
            assert outside.wait(10) == 0
            wait_until(
                lambda: witness.exists() and witness.read_text() == "w0\nw1\nw2\n",
                timeout=20,
                what="the restored turns to run in order",
            )
            log.wait_for("turn.rq.granted")
            granted = [t for t in log.topics("turn.") if t.endswith(".granted")]
            assert granted == [f"turn.{i}.granted" for i in ("w0", "w1", "w2", "rq")]
            assert client.reserve("claude", holder=HOLDER)["reservation"] == "held"
    finally:
        if outside.poll() is None:
            outside.kill()
            outside.wait()


def test_the_turns_a_dead_supervisor_was_running_end_with_one_terminal_event(
    daemon, event_log, state_dir
):
    d = daemon(grace="300ms")
    with d.client() as client:
        client.turn("codex", ["sleep", "300"], id="running")
        wait_until(
            lambda: (
                [(e["id"], e["key"]) for e in queue_file(state_dir)["running"]]
                == [("running", "codex")]
            ),
            what="the granted turn in queue.json",
        )
    # started: its command runs (granted but not started, it would be held for its requester
    # and run when asked again: supervisor.turns.rerun)
    wait_until(lambda: (_guard_record(state_dir, "running") or {}).get("own_group"), what="CMD")
    d.kill()
    d.start()
    with d.client() as client:
        # the story ended at start-up: answered as released, and never run again
        assert client.turn("codex", ["sleep", "300"], id="running")["state"] == "released"
        assert queue_file(state_dir)["running"] == []
        assert all(s["state"] == "free" for s in client.ps()["slots"])


def test_a_restored_request_whose_requester_died_is_cancelled(daemon, state_dir):
    d = daemon(caps="codex = 1")
    requester = subprocess.Popen(["sleep", "300"])
    with d.client() as client:
        client.turn("codex", ["sleep", "300"], id="busy")
        client.turn("codex", ["true"], id="orphan", holder={"pid": requester.pid})
        client.turn("codex", ["true"], id="kept")
    # busy's command runs (granted but not started, it would be held for its requester)
    wait_until(lambda: (_guard_record(state_dir, "busy") or {}).get("own_group"), what="CMD")
    d.kill()
    requester.kill()
    requester.wait()
    d.start()
    with d.client() as client:
        assert client.cancel("orphan")["state"] == "cancelled"
        assert [w["id"] for w in client.ps()["waits"]] == []  # busy's slot was freed: kept ran
        wait_until(
            lambda: client.turn("codex", ["true"], id="kept")["state"] == "released",
            what="kept to run",
        )


def test_a_stored_reservation_end_is_capped_at_now_plus_ttl(daemon, state_dir):
    d = daemon(extra='reservation_ttl = "5s"')
    with d.client() as client:
        client.reserve("codex", holder=HOLDER, id="r1")
    d.kill()
    saved = queue_file(state_dir)
    saved["reservations"][0]["until"] = time.time() + 10**6  # a clock ahead, or a hand edit
    (state_dir / "queue.json").write_text(json.dumps(saved))
    d.start()
    with d.client() as client:
        answer = client.reserve("codex", holder=HOLDER)
        assert answer["reservation"] == "r1" and answer["state"] == "held"
        assert answer["until"] <= time.time() + 5


def test_finished_ids_are_remembered_across_a_restart(daemon, state_dir):
    d = daemon()
    marker = state_dir / "ran"
    with d.client() as client:
        events = list(client.run_turn("codex", ["sh", "-c", f"echo x >> {marker}"], id="once"))
        assert events[-1][0] == "turn.once.released"
    d.stop()
    assert "finished" not in queue_file(state_dir)  # one small append per ending, not a rewrite
    with open(state_dir / "finished.log", "a") as log:
        log.write("torn-by-a-crash rel")  # a last line cut short is skipped, never fatal
    d.start()
    with d.client() as client:
        assert (
            client.turn("codex", ["sh", "-c", f"echo x >> {marker}"], id="once")["state"]
            == "released"
        )
    assert marker.read_text() == "x\n"
    assert "unreadable lines skipped" in d.stderr_path.read_text()
    assert (state_dir / "finished.log").read_text().split()[:2] == ["once", "released"]  # compacted


def test_a_corrupt_or_newer_queue_file_is_moved_aside_and_the_supervisor_starts(
    daemon, event_log, state_dir
):
    d = daemon(start=False)
    for text in ('{"v": 1, "waiting": [', json.dumps({"v": 99, "waiting": []})):
        (state_dir / "queue.json").write_text(text)
        d.start()
        log = event_log(d)
        with d.client() as client:
            assert client.status()["waits"] == 0
        d.stop()
        log.close()
    assert list(state_dir.glob("queue.json.bad-*"))  # kept for a person to look at, never deleted
    logged = d.stderr_path.read_text()
    assert sum("moved aside" in line for line in logged.splitlines()) == 2
    # the second time, the journal of the first run went aside with the snapshot it belongs to
    assert list(state_dir.glob("queue.journal.bad-*"))
    assert "is not valid JSON" in logged and "is version 99, newer than this ccsup knows" in logged


def _guard_record(state_dir, turn_id: str) -> dict | None:
    """The guard record of a turn (guardd.record), once its guard wrote one."""
    for path in (state_dir / "guards").glob("*.json"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if record.get("turn") == turn_id:
            return record
    return None
