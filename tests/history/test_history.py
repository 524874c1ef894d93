"""The history of turns (supervisor.history.db): what it records, how it is read, its state.

Unit tests feed the Recorder the events a supervisor publishes; the end-to-end test runs real
turns of every outcome under a real supervisor, restarts it, and reads the history back.
"""

from __future__ import annotations

import json
import sqlite3
import time

import pytest
from conftest import wait_until

from supervisor.history import db as history
from supervisor.history import writer
from supervisor.history.db import HistoryError, outcome_of, query, show
from supervisor.history.writer import Recorder
from supervisor.wire import protocol


def feed(state_dir, events):
    recorder = Recorder(state_dir)
    recorder.start()
    for topic, body in events:
        recorder.observe(topic, body)
    assert recorder.flush()
    recorder.close()


def story(turn_id, key, *steps, t0=1000.0):
    """[(kind, fields)] -> published (topic, body) pairs, one second apart."""
    out = []
    for n, (kind, fields) in enumerate(steps, 1):
        body = protocol.event_body(
            {"id": turn_id, "key": key, **fields}, seq=n, ts=t0 + n, counters={"turn_seq": n}
        )
        out.append((f"turn.{turn_id}.{kind}", body))
    return out


def ran(turn_id, key="codex", exit_fields=None, t0=1000.0, stop=None):
    steps = [
        ("queued", {"position": 0, "holder": {"session": "s1", "agent": "a"}}),
        ("granted", {"index": 0}),
        ("started", {"guard": {"pid": 42, "start": 7}}),
    ]
    if stop:
        steps.append(("stopping", {"reason": stop}))
    steps += [
        ("stdout", {"offset": 0, "data": "never kept"}),
        ("exited", exit_fields or {"code": 0, "signal": None, "reason": None}),
        ("gone", {}),
        ("released", {"index": 0}),
    ]
    return story(turn_id, key, *steps, t0=t0)


@pytest.mark.parametrize(
    "state, exit_info, stop, outcome",
    [
        ("released", {"code": 0, "signal": None, "reason": None}, None, "ok"),
        ("released", {"code": 3, "signal": None, "reason": None}, None, "exit"),
        ("released", {"code": 137, "signal": 9, "reason": None}, None, "signal"),
        ("released", {"code": 143, "signal": 15, "reason": None}, "cancelled", "cancelled"),
        ("released", {"code": 143, "signal": 15, "reason": None}, "shutdown", "cancelled"),
        ("released", {"code": 124, "signal": None, "reason": "timeout"}, "timeout", "timeout"),
        ("released", {"code": None, "signal": None, "reason": "guard_lost"}, None, "guard_lost"),
        ("released", {"code": 137, "signal": 9, "reason": None, "oom": True}, None, "oom"),
        (
            "released",
            {"code": None, "reason": "supervisor_restarted"},
            None,
            "supervisor_restarted",
        ),
        ("released", {"code": None, "signal": None, "reason": "unable to start"}, None, "error"),
        ("cancelled", None, "cancelled", "cancelled"),
        ("cancelled", None, "timeout", "timeout"),
        ("rejected", None, None, "rejected"),
    ],
)
def test_outcome_of_every_ending(state, exit_info, stop, outcome):
    assert outcome_of(state, exit_info, stop) == outcome


def test_recorded_turns_are_queried_by_key_time_and_outcome_newest_first(state_dir):
    usage = {"wall_s": 2.5, "cpu_user_s": 0.25, "peak_rss_bytes": 1 << 20, "processes": 3}
    feed(
        state_dir,
        ran("a", t0=1000)
        + ran(
            "b",
            key="opencode:xai",
            exit_fields={"code": 2, "signal": None, "reason": None, **usage},
            t0=2000,
        )
        + story(
            "c", "codex", ("queued", {"position": 1}), ("cancelled", {"reason": "timeout"}), t0=3000
        )
        + story("d", "codex", ("rejected", {"reason": "bad 'key'"}), t0=4000)
        + story("r", "codex", ("queued", {"reservation": True}), t0=4500)  # not a turn
        + story("e", "codex", ("queued", {"position": 0}), ("granted", {"index": 1}), t0=5000),
    )
    assert [r["id"] for r in query(state_dir)] == ["d", "c", "b", "a"]  # finished only
    assert [r["id"] for r in query(state_dir, finished=False)] == ["e", "d", "c", "b", "a"]
    assert [r["id"] for r in query(state_dir, key="codex")] == ["d", "c", "a"]
    assert [r["id"] for r in query(state_dir, since=2500)] == ["d", "c"]
    assert [r["id"] for r in query(state_dir, outcomes=["ok", "exit"])] == ["b", "a"]
    a, b = query(state_dir, outcomes=["ok"])[0], query(state_dir, outcomes=["exit"])[0]
    assert a == a | {
        "key": "codex",
        "holder": {"session": "s1", "agent": "a"},
        "state": "released",
        "outcome": "ok",
        "exit_code": 0,
        "queued_at": 1001,
        "granted_at": 1002,
        "started_at": 1003,
        "exited_at": 1005,
        "ended_at": 1007,
        "wait_s": 1,
        "run_s": 2,
        "slot_index": 0,
        "guard_pid": 42,
        "usage": {},
    }
    assert b["usage"] == usage and b["exit_code"] == 2
    c = query(state_dir, outcomes=["timeout"])[0]
    assert (c["id"], c["reason"], c["started_at"]) == ("c", "timeout", None)
    with pytest.raises(HistoryError, match="unknown outcome 'fine'"):
        query(state_dir, outcomes=["fine"])


def test_show_gives_the_whole_record_with_its_events_running_or_finished(state_dir):
    feed(state_dir, ran("a") + story("e", "codex", ("queued", {"position": 0}), t0=5000))
    done = show(state_dir, "a")
    assert [e["kind"] for e in done["events"]] == [
        "queued",
        "granted",
        "started",
        "exited",
        "gone",
        "released",
    ]  # output is never kept
    assert [e["turn_seq"] for e in done["events"]] == [1, 2, 3, 5, 6, 7]
    running = show(state_dir, "e")
    assert (running["state"], running["outcome"], running["ended_at"]) == ("queued", None, None)
    assert show(state_dir, "nope") is None


def test_events_seen_twice_change_nothing(state_dir):
    events = ran("a")
    feed(state_dir, events + events)
    assert len(show(state_dir, "a")["events"]) == 6
    assert len(query(state_dir)) == 1


def test_no_history_a_corrupt_file_and_a_newer_version(state_dir, caplog):
    with pytest.raises(HistoryError, match="no history"):
        query(state_dir)
    path = history.history_path(state_dir)
    path.write_bytes(b"this is not a database" * 100)
    feed(state_dir, ran("a"))
    assert [r["id"] for r in query(state_dir)] == ["a"]  # started afresh
    assert len(list(state_dir.glob("history.sqlite.corrupt-*"))) == 1
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 99")
    db.commit()
    db.close()
    with pytest.raises(HistoryError, match="version 99, written by a newer ccsup"):
        query(state_dir)
    feed(state_dir, ran("b"))  # not written: the file is left as it is
    db = sqlite3.connect(path)
    assert [r[0] for r in db.execute("SELECT id FROM turns")] == ["a"]
    db.close()


def test_prune_forgets_turns_that_ended_before_a_time_and_marks_pruned_logs(state_dir):
    feed(state_dir, ran("old", t0=1000) + ran("new", t0=9000))
    recorder = Recorder(state_dir)
    recorder.start()
    recorder.mark_pruned(["new"], 9500.0)
    recorder.prune(5000.0)
    assert recorder.flush()
    recorder.close()
    assert [(r["id"], r["log_pruned_at"]) for r in query(state_dir)] == [("new", 9500.0)]
    assert show(state_dir, "old") is None


@pytest.mark.timeout(60)
def test_a_real_supervisor_records_every_outcome_and_keeps_it_across_a_restart(daemon, state_dir):
    d = daemon(caps="codex = 1")
    with d.client() as client:
        list(client.run_turn("codex", ["true"], id="fine"))
        list(client.run_turn("codex", ["sh", "-c", "exit 3"], id="three"))
        list(client.run_turn("codex", ["sh", "-c", "kill -9 $$"], id="killed"))
        with client.subscribe(["turn.long."]) as sub:
            client.turn("codex", ["sleep", "30"], id="long")
            client.turn("codex", ["true"], id="waiting")
            for topic, _ in sub.until_terminal(idle_check=client.check_running):
                if topic.endswith(".started"):
                    # a running turn is in the history too, as far as it has come
                    running = wait_until(
                        lambda: (
                            (show(state_dir, "long") or {}).get("state") == "started"
                            and show(state_dir, "long")
                        ),
                        what="the running turn in the history",
                    )
                    assert running["outcome"] is None and running["guard_pid"] > 0
                    client.cancel("waiting")
                    client.cancel("long")
        sub = client.publish_request("turn", {"id": "bad", "key": "no/such", "argv": ["x"]})
        sub.close()

    def outcomes():
        try:
            return {r["id"]: r["outcome"] for r in query(state_dir)}
        except HistoryError:
            return {}

    expected = {
        "fine": "ok",
        "three": "exit",
        "killed": "signal",
        "long": "cancelled",
        "waiting": "cancelled",
        "bad": "rejected",
    }
    wait_until(lambda: outcomes() == expected, what=f"history {expected}, have {outcomes()}")
    three = show(state_dir, "three")
    assert three["exit_code"] == 3 and three["run_s"] >= 0 and three["wait_s"] >= 0
    assert query(state_dir, outcomes=["signal"])[0]["signal"] == 9
    d.stop()
    d2 = daemon(caps="codex = 1")
    with d2.client() as client:
        list(client.run_turn("codex", ["true"], id="after"))
    wait_until(lambda: outcomes() == {**expected, "after": "ok"}, what="history after a restart")


def ccsup(state_dir, *args):
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "supervisor", "--state-dir", str(state_dir), *args],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_ccsup_history_and_show_read_the_file_without_a_supervisor(state_dir):
    usage = {"cpu_user_s": 1.5, "peak_rss_bytes": 3 << 20}
    feed(
        state_dir,
        ran("a", t0=time.time() - 7200)
        + ran("b", exit_fields={"code": 3, "signal": None, "reason": None, **usage}, t0=time.time())
        + story("e", "codex", ("queued", {"position": 0}), t0=time.time()),
    )
    listed = ccsup(state_dir, "history", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [r["id"] for r in json.loads(listed.stdout)] == ["b", "a"]
    recent = ccsup(state_dir, "history", "--since", "1h")
    assert recent.returncode == 0 and recent.stdout.splitlines()[0].split()[:4] == [
        "ID",
        "KEY",
        "HOLDER",
        "OUTCOME",
    ]
    assert "CPU USER" in recent.stdout and "PEAK RSS" in recent.stdout  # shown once present
    (row,) = recent.stdout.splitlines()[1:]
    assert row.split()[:5] == ["b", "codex", "s1/a", "exit", "3"] and "3.0MiB" in row
    assert ccsup(state_dir, "history", "--outcome", "ok").stdout.splitlines()[1].split()[0] == "a"
    bad = ccsup(state_dir, "history", "--outcome", "fine")
    assert bad.returncode == 2 and "'fine'; known: ok, exit" in bad.stderr
    shown = ccsup(state_dir, "show", "b")
    assert shown.returncode == 0, shown.stderr
    assert "  outcome    exit 3" in shown.stdout and "  cpu user   1.500s" in shown.stdout
    assert "{" not in shown.stdout and '"' not in shown.stdout  # plain text, no raw JSON
    assert [line.split()[2] for line in shown.stdout.splitlines() if line.startswith("    ")] == [
        "queued",
        "granted",
        "started",
        "exited",
        "gone",
        "released",
    ]
    assert json.loads(ccsup(state_dir, "show", "e", "--json").stdout)["state"] == "queued"
    missing = ccsup(state_dir, "show", "nope")
    assert missing.returncode == 1 and "no turn nope on " in missing.stderr


V1_TURNS = """CREATE TABLE turns (id TEXT PRIMARY KEY, key TEXT NOT NULL, holder TEXT,
 state TEXT NOT NULL, outcome TEXT, exit_code INTEGER, signal INTEGER, reason TEXT,
 queued_at REAL, granted_at REAL, started_at REAL, exited_at REAL, ended_at REAL,
 slot_index INTEGER, guard_pid INTEGER, usage TEXT, log_pruned_at REAL);
CREATE TABLE events (turn_id TEXT NOT NULL, turn_seq INTEGER, kind TEXT NOT NULL, ts REAL NOT NULL,
 body TEXT NOT NULL, PRIMARY KEY (turn_id, kind, ts)) WITHOUT ROWID;
INSERT INTO turns (id, key, state, outcome, queued_at, ended_at) VALUES
 ('old', 'codex', 'released', 'ok', 1.0, 2.0);
PRAGMA user_version = 1;"""


def test_a_version_1_file_is_read_as_it_is_and_migrated_by_the_writer_keeping_its_rows(state_dir):
    db = sqlite3.connect(history.history_path(state_dir))
    db.executescript(V1_TURNS)
    db.close()
    (old,) = query(state_dir)  # read-only: a reader never migrates
    assert (old["id"], old["argv"], old["cwd"]) == ("old", None, None)
    queued = ("queued", {"position": 0, "holder": {}, "argv": ["sh", "-c", "é"], "cwd": "/tmp"})
    feed(state_dir, story("new", "codex", queued, ("cancelled", {"reason": "cancelled"})))
    by_id = {r["id"]: r for r in query(state_dir)}
    assert (by_id["new"]["argv"], by_id["new"]["cwd"]) == (["sh", "-c", "é"], "/tmp")
    assert (by_id["old"]["outcome"], by_id["old"]["argv"]) == ("ok", None)
    db = sqlite3.connect(history.history_path(state_dir))
    assert db.execute("PRAGMA user_version").fetchone()[0] == history.SCHEMA_VERSION == 4
    db.close()


def test_version_4_columns_come_from_their_events(tmp_path):
    """peak_mem from the exited event, member from granted, leftovers from its own event; a
    version-3 file gains the three columns (NULL in its old rows) at the writer's next start."""
    state_dir = tmp_path / "s"
    state_dir.mkdir()
    path = history.history_path(state_dir)
    db = sqlite3.connect(path)
    # A version-3 file: the schema without the lines of version 4's columns.
    lines = [line for line in history.SCHEMA.splitlines() if "(version 4)" not in line]
    db.executescript("\n".join(lines).replace("REAL,      -- seconds", "REAL       -- seconds"))
    db.execute("PRAGMA user_version = 3")
    db.commit()
    db.close()
    t = 1000.0
    events = [
        ("turn.a.queued", {"key": "codex", "ts": t, "argv": ["true"], "holder": {}}),
        ("turn.a.granted", {"key": "codex", "ts": t + 1, "index": 0, "member": "codex:work"}),
        ("turn.a.started", {"key": "codex", "ts": t + 2, "guard": {"pid": 7}}),
        ("turn.a.exited", {"key": "codex", "ts": t + 3, "code": 0, "peak_mem": 5 << 20}),
        ("turn.a.leftovers", {"key": "codex", "ts": t + 3.1, "count": 1, "names": ["x"]}),
        ("turn.a.released", {"key": "codex", "ts": t + 4}),
    ]
    db = writer.open_writer(path)
    assert db is not None
    with db:
        for topic, body in events:
            writer.apply_event(db, topic, body)
    db.close()
    row = show(state_dir, "a")
    assert (row["peak_mem"], row["member"], row["leftovers"], row["state"], row["outcome"]) == (
        5 << 20,
        "codex:work",
        {"count": 1, "names": ["x"]},
        "released",
        "ok",
    )


def test_a_terminal_s_table_keeps_the_command_and_one_row_per_turn():
    """160 columns: the COMMAND column stays (short ids and times, usage columns given up for
    it); a command with a newline stays on its row, the newline shown as \\n."""
    from supervisor.cli.views.records import format_history

    now = time.time()
    record = {
        "id": "5c6c550e8bcc4c67adbe98b06a9e3c58",
        "key": "opencode:xai",
        "holder": {"session": "a-long-session-name", "agent": "reviewer"},
        "state": "released",
        "outcome": "ok",
        "exit_code": 0,
        "signal": None,
        "queued_at": now - 60,
        "ended_at": now,
        "wait_s": 0.5,
        "run_s": 59.5,
        "usage": {
            "cpu_user_s": 1.0,
            "cpu_system_s": 0.5,
            "peak_rss_bytes": 3 << 20,
            "processes": 4,
        },
        "argv": ["sh", "-c", "echo first\npytest -x tests/unit/test_something_long.py"],
        "adopted_at": None,
    }
    lines = format_history([record], 160)
    assert len(lines) == 2 and all(len(line) <= 160 for line in lines)
    assert "COMMAND" in lines[0]
    command = lines[1][lines[0].index("COMMAND") :]
    assert len(command) >= 24 and command.startswith("sh -c 'echo first\\npytest")
    assert lines[1].startswith("5c6c550e  opencode:xai")
    assert "\n" not in format_history([record])[1]  # off a terminal: whole, still one row


def test_ends_finished_log_holds_repair_a_history_that_lost_them_dated_as_they_happened(
    state_dir,
):
    """A SIGKILL within the writer's batch loses a turn's last events; the next supervisor writes
    them from finished.log's ends (Recorder.repair): exit, stop reason, the times they happened.
    A turn whose history is whole is left alone, and a repair run twice changes nothing."""
    whole = ran("w")  # its end reached the history
    cut = ran("c")[:3]  # queued, granted, started: its end was in the SIGKILLed batch
    stopped = ran("s", t0=2000.0)[:3]
    feed(state_dir, whole + cut + stopped)
    ends = {
        "w": {"key": "codex", "state": "released", "ended_at": 9999.0, "exit": {"code": 3}},
        "c": {
            "key": "codex",
            "state": "released",
            "ended_at": 1010.5,
            "exit": {"code": 7, "signal": None, "reason": None},
            "exited_at": 1010.25,
        },
        "s": {
            "key": "codex",
            "state": "released",
            "ended_at": 2010.0,
            "exit": {"code": 143, "signal": 15, "reason": None},
            "exited_at": 2009.0,
            "stop_reason": "cancelled",
        },
        "q": {"key": "codex", "state": "cancelled", "ended_at": 3000.0, "reason": "requester_gone"},
    }
    for _ in range(2):
        recorder = Recorder(state_dir)
        recorder.start()
        recorder.repair(ends)
        assert recorder.flush()
        recorder.close()
    w, c, s, q = (show(state_dir, i) for i in "wcsq")
    assert (w["outcome"], w["exit_code"], w["ended_at"]) == ("ok", 0, 1007.0)  # untouched
    assert (c["state"], c["outcome"], c["exit_code"]) == ("released", "exit", 7)
    assert (c["exited_at"], c["ended_at"], c["run_s"]) == (1010.25, 1010.5, 7.25)
    assert [e["kind"] for e in c["events"]] == [
        "queued",
        "granted",
        "started",
        "exited",
        "released",
    ]
    assert c["events"][-1]["body"]["repaired"] is True
    assert (s["outcome"], s["signal"]) == ("cancelled", 15)
    assert (q["state"], q["reason"], q["ended_at"]) == ("cancelled", "requester_gone", 3000.0)


def test_an_exited_event_dated_by_its_guard_is_recorded_at_that_time(state_dir):
    """A turn that ended while no supervisor ran is settled later: its `exited` carries
    exited_at (the guard's record), and the history's exited_at and run_s follow it."""
    events = ran("g", exit_fields={"code": 0, "signal": None, "reason": None, "exited_at": 1004.5})
    feed(state_dir, events)
    row = show(state_dir, "g")
    assert (row["exited_at"], row["run_s"]) == (1004.5, 1.5)
    assert "exited_at" not in (row["usage"] or {})
