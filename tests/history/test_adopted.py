"""An adopted turn shows: `turn.<id>.adopted` in the history (adopted_at,
adoption_gap_s; schema version 3, a version-2 file read as it is and migrated), in `ccsup show`
and `ccsup history --json`, and in ccsup_turns_adopted_total.

The events are fed to the Recorder and to Metrics as the daemon feeds them (server.observers), in
the body the supervisor publishes: {"v", "ts", "seq", "id", "key", "index", "guard", "gap_s"}.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time

from test_history import feed, ran, story
from test_metrics import samples

from supervisor.history import db as history
from supervisor.history.db import query, show
from supervisor.history.metrics import Metrics

GUARD = {"pid": 4242, "start": 77}


def adopted_turn(turn_id: str, gap: float, t0: float = 1000.0, *, twice: bool = False):
    """A turn started by one supervisor and adopted by the next (and, twice, by a third)."""
    adoption = ("adopted", {"index": 0, "guard": GUARD, "gap_s": gap})
    steps = [
        ("queued", {"position": 0, "holder": {"session": "s1", "agent": "a"}}),
        ("granted", {"index": 0}),
        ("started", {"guard": GUARD}),
        adoption,
    ]
    if twice:
        steps.append(("adopted", {"index": 0, "guard": GUARD, "gap_s": 0.5}))
    steps += [
        ("stdout", {"offset": 0, "data": "never kept"}),
        ("exited", {"code": 0, "signal": None, "reason": None}),
        ("gone", {}),
        ("released", {"index": 0}),
    ]
    return story(turn_id, "codex", *steps, t0=t0)


def test_an_adopted_turn_says_when_and_the_gap_and_runs_on_to_its_outcome(state_dir):
    events = adopted_turn("a", 1.25)
    feed(state_dir, events[:4])  # adopted, still running
    running = show(state_dir, "a")
    assert (running["state"], running["outcome"]) == ("started", None)  # it still runs
    assert (running["adopted_at"], running["adoption_gap_s"]) == (1004.0, 1.25)
    feed(state_dir, events + events)  # the rest, and every event seen twice: nothing changes
    done = show(state_dir, "a")
    assert (done["outcome"], done["adopted_at"], done["adoption_gap_s"]) == ("ok", 1004.0, 1.25)
    assert [e["kind"] for e in done["events"]].count("adopted") == 1
    feed(state_dir, ran("plain"))
    assert show(state_dir, "plain")["adopted_at"] is None
    assert show(state_dir, "plain")["adoption_gap_s"] is None


def test_a_turn_adopted_twice_sums_its_gaps_and_keeps_the_last_adoption(state_dir):
    feed(state_dir, adopted_turn("a", 1.25, twice=True))
    record = show(state_dir, "a")
    assert (record["adopted_at"], record["adoption_gap_s"]) == (1005.0, 1.75)


def test_an_adopted_turn_whose_start_the_history_lost_is_recorded_as_started(state_dir):
    """The old supervisor died with its started event still queued for the writer."""
    events = adopted_turn("a", 2.0)
    feed(state_dir, events[:2] + events[3:4])  # queued, granted, adopted
    record = show(state_dir, "a")
    assert (record["state"], record["slot_index"], record["guard_pid"]) == ("started", 0, 4242)
    # only its adopted event known (every earlier one lost): the row is made from it
    body = {"index": 1, "guard": GUARD, "gap_s": 0.5, "started_at": 990.5}
    feed(state_dir, story("b", "codex", ("adopted", body)))
    b = show(state_dir, "b")
    assert (b["key"], b["state"], b["slot_index"], b["adoption_gap_s"]) == (
        "codex",
        "started",
        1,
        0.5,
    )
    feed(state_dir, story("b", "codex", ("exited", {"code": 0}), t0=1010.0))
    b = show(state_dir, "b")
    assert (b["state"], b["started_at"], b["run_s"]) == ("exited", 990.5, 1011.0 - 990.5)
    assert show(state_dir, "a")["started_at"] is None  # no started_at in its adopted event


V2_FILE = """CREATE TABLE turns (id TEXT PRIMARY KEY, key TEXT NOT NULL, holder TEXT,
 state TEXT NOT NULL, outcome TEXT, exit_code INTEGER, signal INTEGER, reason TEXT,
 queued_at REAL, granted_at REAL, started_at REAL, exited_at REAL, ended_at REAL,
 slot_index INTEGER, guard_pid INTEGER, usage TEXT, log_pruned_at REAL, argv TEXT, cwd TEXT);
CREATE INDEX turns_key_ended ON turns(key, ended_at);
CREATE INDEX turns_ended ON turns(ended_at);
CREATE TABLE events (turn_id TEXT NOT NULL, turn_seq INTEGER, kind TEXT NOT NULL, ts REAL NOT NULL,
 body TEXT NOT NULL, PRIMARY KEY (turn_id, kind, ts)) WITHOUT ROWID;
INSERT INTO turns (id, key, state, outcome, queued_at, ended_at, argv) VALUES
 ('old', 'codex', 'released', 'ok', 1.0, 2.0, '["true"]');
PRAGMA user_version = 2;"""


def test_a_version_2_file_is_read_as_never_adopted_and_migrated_by_the_writer(state_dir):
    db = sqlite3.connect(history.history_path(state_dir))
    db.executescript(V2_FILE)
    db.close()
    (old,) = query(state_dir)  # a reader never migrates: the columns are missing, read None
    assert (old["argv"], old["adopted_at"], old["adoption_gap_s"]) == (["true"], None, None)
    assert show(state_dir, "old")["adopted_at"] is None
    feed(state_dir, adopted_turn("new", 0.75))
    by_id = {r["id"]: r for r in query(state_dir)}
    assert (by_id["new"]["adopted_at"], by_id["new"]["adoption_gap_s"]) == (1004.0, 0.75)
    assert (by_id["old"]["outcome"], by_id["old"]["adopted_at"]) == ("ok", None)
    db = sqlite3.connect(history.history_path(state_dir))
    assert db.execute("PRAGMA user_version").fetchone()[0] == history.SCHEMA_VERSION == 4
    columns = [row[1] for row in db.execute("PRAGMA table_info(turns)")]
    db.close()
    assert columns[-5:] == ["adopted_at", "adoption_gap_s", "peak_mem", "leftovers", "member"]


def ccsup(state_dir, *args):
    return subprocess.run(
        [sys.executable, "-m", "supervisor", "--state-dir", str(state_dir), *args],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_ccsup_show_and_history_say_a_turn_was_adopted_when_and_the_gap(state_dir):
    t0 = time.time() - 60
    feed(state_dir, adopted_turn("a", 1.2, t0=t0) + ran("plain", t0=t0 + 1))
    shown = ccsup(state_dir, "show", "a")
    assert shown.returncode == 0, shown.stderr
    at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t0 + 4))
    assert f"  adopted    {at} after a gap of 1.2 s" in shown.stdout.splitlines()
    plain = ccsup(state_dir, "show", "plain")
    assert plain.returncode == 0 and "adopted" not in plain.stdout
    listed = ccsup(state_dir, "history", "--json")
    assert listed.returncode == 0, listed.stderr
    by_id = {r["id"]: r for r in json.loads(listed.stdout)}
    assert (by_id["a"]["adopted_at"], by_id["a"]["adoption_gap_s"]) == (t0 + 4, 1.2)
    assert (by_id["plain"]["adopted_at"], by_id["plain"]["adoption_gap_s"]) == (None, None)
    table = ccsup(state_dir, "history").stdout.splitlines()
    assert "ADOPTED" in table[0].split()
    rows = {line.split()[0]: line for line in table[1:]}
    assert "1.2 s" in rows["a"] and "1.2 s" not in rows["plain"]


def test_the_turns_adopted_counter_counts_the_adopted_events_by_key():
    m = Metrics(ps=lambda: {"slots": [], "waits": []})
    for topic, body in adopted_turn("a", 1.0) + adopted_turn("b", 2.0, twice=True):
        m.observe(topic, body)
    # a new supervisor sees only the adopted event and what follows it: no queued, no started
    later = {"index": 0, "guard": GUARD, "gap_s": 0.1, "started_at": 1000.5}
    for topic, body in adopted_turn("c", 1.0)[3:] + story(
        "d", "other", ("adopted", later), ("exited", {"code": 0}), ("released", {})
    ):
        m.observe(topic, body)
    got = samples(m.exposition().decode())
    assert got[("ccsup_turns_adopted_total", (("key", "codex"),))] == 4
    assert got[("ccsup_turns_adopted_total", (("key", "other"),))] == 1
    assert got[("ccsup_turns_ended_total", (("key", "codex"), ("outcome", "ok")))] == 3
    # its run time from the guard's start (started_at), the started event being the old one's
    assert got[("ccsup_turn_run_seconds_count", (("key", "other"),))] == 1
    assert got[("ccsup_turn_run_seconds_sum", (("key", "other"),))] == 1002.0 - 1000.5
    plain = Metrics(ps=lambda: {"slots": [], "waits": []})
    for topic, body in ran("p"):
        plain.observe(topic, body)
    assert not any(
        name == "ccsup_turns_adopted_total" for name, _ in samples(plain.exposition().decode())
    )
