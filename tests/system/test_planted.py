"""One bad entry or planted file never keeps the supervisor from starting.

Each test puts what a hostile local user, a crash or a careless script could leave in a state
directory, starts a real supervisor on it, and checks that it answers, says what it refused, and
still does its work. State files are opened without following symlinks and without blocking
(guardd.record.read_file), read with a size bound, and every restored entry is checked as a new
request is.
"""

from __future__ import annotations

import json
import os
import time

from supervisor.turns import store

HOLDER = {"session": "s1", "agent": "a1"}


def daemon_log(d) -> str:
    return d.stderr_path.read_text()


def write_queue(state_dir, **sections) -> None:
    body = {"v": 1, "gen": 0, "waiting": [], "reservations": [], "running": [], **sections}
    (state_dir / "queue.json").write_text(json.dumps(body))
    os.chmod(state_dir / "queue.json", 0o600)


def test_a_journal_line_that_is_json_but_no_object_is_refused_and_the_rest_restored(
    daemon, state_dir
):
    d = daemon(caps="one = 1")
    with d.client() as client:
        client.turn("one", ["sleep", "300"], id="busy")
        client.turn("one", ["sleep", "300"], id="w1")
    d.kill()
    journal = store.journal_path(state_dir / "queue.json")
    assert b'"w1"' in journal.read_bytes()
    with open(journal, "ab") as f:
        f.write(b"[1, 2]\n")
    d.start()  # it was: AttributeError, and no supervisor
    assert "is not a journal entry (not an object)" in daemon_log(d)
    assert list(state_dir.glob("queue.journal.bad-*"))
    with d.client() as client:  # the lines before the bad one are kept: w1 waits, or runs
        ps = client.ps()
        here = [w["id"] for w in ps["waits"]] + [s["turn"] for s in ps["slots"]]
        assert "w1" in here, ps


def test_restored_entries_are_checked_as_requests_are(daemon, state_dir):
    """A reservation of `../../x` or `_machine` stopped the start (exit 2); an id with a newline
    went into finished.log as two lines, so that `z` read as finished and never ran."""
    now = time.time()
    reservation = {"holder": HOLDER, "requested_at": now, "state": "queued"}
    write_queue(
        state_dir,
        reservations=[
            {"id": "r1", "key": "../../x", **reservation},
            {"id": "r2", "key": "_machine", **reservation},
            {"id": "r3", "key": "ok", **reservation},
        ],
        running=[{"id": "x\nz", "key": "one"}, {"id": "r4", "key": "../y"}],
        finished={"y\nz": ["released", now]},
    )
    d = daemon(caps="one = 1, ok = 1")
    log = daemon_log(d)
    assert "reservation entry" in log and "../../x" in log and "_machine" in log
    assert "running entry" in log and "finished entry 'y\\nz' is not a turn id" in log
    assert not (state_dir / "x").exists() and not (state_dir.parent / "x").exists()
    finished = (
        (state_dir / "finished.log").read_text() if (state_dir / "finished.log").exists() else ""
    )
    assert all(len(line.split()) == 3 for line in finished.splitlines()), finished
    with d.client() as client:
        slots = {(s["key"], s["state"]) for s in client.ps()["slots"]}
        assert ("ok", "reserved") in slots  # the good reservation came back and was granted
        events = list(client.run_turn("one", ["true"], id="z"))
    assert events[-1][0] == "turn.z.released"
    assert [e for e in events if e[0] == "turn.z.exited"][0][1]["code"] == 0  # it ran


def test_symlinked_slot_files_are_unreadable_slots_not_a_traceback(daemon, state_dir, tmp_path):
    """A slot record or a lock that is a symlink: ELOOP came out as a traceback; and a 300 MB
    file as a record was read whole at every periodic look."""
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(300 << 20)  # sparse: 300 MB to read, no disk used
    for key in ("rec", "lock", "huge"):
        (state_dir / "slots" / key).mkdir(parents=True)
    (state_dir / "slots" / "rec" / "slot-0.json").symlink_to(big)
    (state_dir / "slots" / "rec" / "slot-0.lock").touch()
    (state_dir / "slots" / "lock" / "slot-0.lock").symlink_to(tmp_path / "elsewhere.lock")
    os.link(big, state_dir / "slots" / "huge" / "slot-0.json")  # the same file, not a symlink
    (state_dir / "slots" / "huge" / "slot-0.lock").touch()
    d = daemon(caps="rec = 2, lock = 2, huge = 2")
    with d.client() as client:
        started = time.monotonic()
        ps = client.ps()
        elapsed = time.monotonic() - started
        views = {s["key"]: s for s in ps["slots"] if s["index"] == 0}
        assert {k: views[k]["state"] for k in ("rec", "lock", "huge")} == dict.fromkeys(
            ("rec", "lock", "huge"), "unreadable"
        )
        assert "symbolic link" in views["rec"]["error"]
        assert "not a regular file" in views["lock"]["error"]
        assert "over the limit" in views["huge"]["error"]
        assert elapsed < 2.0, elapsed  # nothing of the 300 MB was read
        for key in ("rec", "lock", "huge"):  # index 1 still serves; index 0 is never used
            events = list(client.run_turn(key, ["true"], id=f"t-{key}"))
            assert events[-1][0] == f"turn.t-{key}.released", events[-1]
    assert not (tmp_path / "elsewhere.lock").exists()  # the symlink was not followed


def test_fifos_in_place_of_state_files_do_not_hang_the_start(daemon, state_dir):
    """A FIFO as queue.json, finished.log, admission.json, a slot record or a guard record: each
    was opened blocking on the event loop, and start said "did not answer"."""
    for name in ("queue.json", "finished.log", "admission.json"):
        os.mkfifo(state_dir / name, 0o600)
    (state_dir / "slots" / "one").mkdir(parents=True)
    os.mkfifo(state_dir / "slots" / "one" / "slot-0.json", 0o600)
    (state_dir / "slots" / "one" / "slot-0.lock").touch()
    (state_dir / "guards").mkdir(mode=0o700)
    guard_fifo = state_dir / "guards" / "1-1.json"
    os.mkfifo(guard_fifo, 0o600)
    (state_dir / "slots" / "two").mkdir(parents=True)
    (state_dir / "slots" / "two" / "slot-0.lock").touch()
    dead = {"pid": 2**22 + 1, "start": 1}
    work = {"guard": dead, "record": str(guard_fifo), "groups": []}
    record = {"v": 1, "key": "two", "index": 0, "cap": 2, "holder": dict(dead), "turn": "old"}
    record |= {"reservation": None, "work": work, "released": False, "updated_at": time.time()}
    (state_dir / "slots" / "two" / "slot-0.json").write_text(json.dumps(record))
    d = daemon(caps="one = 2, two = 2")
    for name in ("queue.json", "finished.log", "admission.json"):
        assert list(state_dir.glob(f"{name}.bad-*")), name  # moved aside, named in the log
        assert f"{state_dir / name} is not a regular file" in daemon_log(d)
    with d.client() as client:
        ps = client.ps()
        [one] = [s for s in ps["slots"] if s["key"] == "one"]
        assert one["state"] == "unreadable" and "not a regular file" in one["error"]
        for key in ("one", "two"):
            events = list(client.run_turn(key, ["true"], id=f"t-{key}"))
            assert events[-1][0] == f"turn.t-{key}.released"
        client.reserve("two", holder=HOLDER, id="r")  # admission and the queue are written again
    assert (state_dir / "queue.json").is_file()
