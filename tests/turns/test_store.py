"""queue.json + queue.journal: appended per change, compacted now and then, and every bad state
(torn last line, corrupt line, newer or foreign journal, a writer SIGKILLed) read back safely."""

from __future__ import annotations

import errno
import json
import signal
import subprocess
import sys

import pytest
from conftest import ROOT
from small_disk import full, small_tmpfs

from supervisor.turns import store


def waiting(i: int, env: dict | None = None) -> store.Entry:
    return "waiting", {"id": f"w{i}", "key": "k", "argv": ["true"], "env": env or {}}


def journal_lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_changes_are_appended_and_read_back_over_the_snapshot(tmp_path):
    q = store.QueueFile(tmp_path / "queue.json")
    q.replace({"w0": waiting(0)})
    q.update({"w1": waiting(1), "w2": waiting(2)})
    q.update({"w0": None, "w1": ("running", {"id": "w1", "key": "k"})})
    snapshot = json.loads((tmp_path / "queue.json").read_text())
    assert [w["id"] for w in snapshot["waiting"]] == ["w0"]  # not rewritten per change
    assert journal_lines(tmp_path / "queue.journal")[0] == {"v": 1, "gen": snapshot["gen"]}
    assert len(journal_lines(tmp_path / "queue.journal")) == 1 + 4
    data, problem = store.load(tmp_path / "queue.json")
    assert problem is None
    assert [w["id"] for w in data["waiting"]] == ["w2"]
    assert [(e["id"], e["key"]) for e in data["running"]] == [("w1", "k")]


def test_the_journal_is_compacted_so_each_change_costs_o1(tmp_path):
    q = store.QueueFile(tmp_path / "queue.json")
    q.replace({})
    for i in range(3000):
        q.update({f"w{i}": waiting(i)})
        if i >= 10:
            q.update({f"w{i - 10}": None})
    # 5,990 changes, 10 live entries: compacted about every COMPACT_MIN changes, never per change
    assert 5990 // store.COMPACT_MIN - 2 <= q.compactions <= 5990 // store.COMPACT_MIN + 2
    assert len(journal_lines(tmp_path / "queue.journal")) <= store.COMPACT_MIN + 1
    data, _ = store.load(tmp_path / "queue.json")
    assert [w["id"] for w in data["waiting"]] == [f"w{i}" for i in range(2990, 3000)]


def test_a_waiting_env_is_a_file_of_its_own_and_leaving_costs_one_line(tmp_path):
    q = store.QueueFile(tmp_path / "queue.json")
    q.replace({})
    for i in range(50):
        q.update({f"w{i}": waiting(i, {"TOKEN": f"s3cret{i}"})})
    secret = tmp_path / "secrets" / "w0.json"
    assert (tmp_path / "secrets").stat().st_mode & 0o777 == 0o700
    assert secret.stat().st_mode & 0o777 == 0o600
    assert json.loads(secret.read_text())["env"] == {"TOKEN": "s3cret0"}
    data, problem = store.load(tmp_path / "queue.json")
    assert problem is None and data["waiting"][0]["env"] == {"TOKEN": "s3cret0"}
    lines = len(journal_lines(tmp_path / "queue.journal"))
    q.update({"w0": ("running", {"id": "w0", "key": "k"})})
    q.update({"w1": None})
    # one line each, no rewrite of what else waits
    assert q.compactions == 1 and len(journal_lines(tmp_path / "queue.journal")) == lines + 2
    assert q.files.drain()
    assert not secret.exists() and not (tmp_path / "secrets" / "w1.json").exists()
    for path in [tmp_path / "queue.json", tmp_path / "queue.journal"]:
        assert "s3cret" not in path.read_text(), path  # never in queue.json or its journal
    q.compact()
    assert "s3cret" not in (tmp_path / "queue.json").read_text()
    data, _ = store.load(tmp_path / "queue.json")
    assert [w["env"]["TOKEN"] for w in data["waiting"]][:2] == ["s3cret2", "s3cret3"]


def test_an_inline_env_of_an_older_build_moves_to_its_file_and_strays_are_removed(tmp_path):
    path = tmp_path / "queue.json"
    path.write_text(json.dumps({"v": 1, "waiting": [waiting(0, {"TOKEN": "old"})[1]]}))
    (tmp_path / "secrets").mkdir(mode=0o700)
    stray = tmp_path / "secrets" / "gone.json"  # a crash after the line that ended its wait
    stray.write_text('{"v": 1, "id": "gone", "env": {"TOKEN": "x"}}')
    data, _ = store.load(path)
    q = store.QueueFile(path)
    q.replace({w["id"]: ("waiting", w) for w in data["waiting"]})
    assert "old" not in path.read_text()
    assert json.loads((tmp_path / "secrets" / "w0.json").read_text())["env"] == {"TOKEN": "old"}
    assert not stray.exists()
    assert store.load(path)[0]["waiting"][0]["env"] == {"TOKEN": "old"}


def test_a_waiting_turn_whose_env_file_is_gone_is_not_restored_and_said(tmp_path):
    q = store.QueueFile(tmp_path / "queue.json")
    q.replace({})
    q.update({"w0": waiting(0, {"TOKEN": "a"}), "w1": waiting(1, {"TOKEN": "b"})})
    (tmp_path / "secrets" / "w0.json").unlink()
    data, problem = store.load(tmp_path / "queue.json")
    assert [w["id"] for w in data["waiting"]] == ["w1"]
    assert "unable to read the env of waiting turn w0" in problem
    assert str(tmp_path / "secrets" / "w0.json") in problem


def test_a_torn_last_line_is_skipped_and_said(tmp_path):
    q = store.QueueFile(tmp_path / "queue.json")
    q.replace({})
    q.update({"w0": waiting(0)})
    q.update({"w1": waiting(1)})
    journal = tmp_path / "queue.journal"
    journal.write_bytes(journal.read_bytes()[:-7])  # the last append cut short
    data, problem = store.load(tmp_path / "queue.json")
    assert [w["id"] for w in data["waiting"]] == ["w0"]
    assert problem == f"{journal}: a torn last line was skipped"
    assert journal.exists()  # expected after a crash: nothing moved aside


@pytest.mark.parametrize(
    "damage, reason",
    [
        (lambda lines: ["garbage", *lines[1:]], "has no valid header line"),
        (lambda lines: ['{"v":2,"gen":1}', *lines[1:]], "is version 2, newer than this ccsup"),
        (lambda lines: [lines[0], "{not json", *lines[1:]], "line 2 is not a journal entry"),
        (lambda lines: [lines[0], '{"put":"nowhere","item":{}}', *lines[1:]], "line 2 is not"),
        (lambda lines: ['{"v":1,"gen":99}', *lines[1:]], "is generation 99, not queue.json's 1"),
    ],
)
def test_a_corrupt_newer_or_foreign_journal_is_moved_aside_and_said(tmp_path, damage, reason):
    q = store.QueueFile(tmp_path / "queue.json")
    q.replace({"w0": waiting(0)})
    q.update({"w1": waiting(1)})
    journal = tmp_path / "queue.journal"
    journal.write_text("\n".join(damage(journal.read_text().splitlines())) + "\n")
    data, problem = store.load(tmp_path / "queue.json")
    assert reason in problem and "moved aside to" in problem
    assert [w["id"] for w in data["waiting"]] == ["w0"]  # the snapshot still counts
    assert not journal.exists() and list(tmp_path.glob("queue.journal.bad-*"))


def test_a_journal_of_an_older_generation_is_not_replayed(tmp_path):
    """A crash between the new snapshot and the journal's reset: the snapshot already holds it."""
    q = store.QueueFile(tmp_path / "queue.json")
    q.replace({})
    q.update({"w0": waiting(0)})
    stale = (tmp_path / "queue.journal").read_bytes()
    q.update({"w0": None})
    q.compact()
    (tmp_path / "queue.journal").write_bytes(stale)  # as if the reset never happened
    data, problem = store.load(tmp_path / "queue.json")
    assert problem is None and data["waiting"] == []


def test_a_new_writer_continues_above_the_generations_on_disk(tmp_path):
    q = store.QueueFile(tmp_path / "queue.json")
    q.replace({})
    q.compact()
    q.compact()
    restarted = store.QueueFile(tmp_path / "queue.json")
    restarted.replace({"w0": waiting(0)})
    assert restarted.gen == 4
    assert store.load(tmp_path / "queue.json")[0]["waiting"][0]["id"] == "w0"


WRITER = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
from pathlib import Path
from supervisor.turns import store
q = store.QueueFile(Path(sys.argv[1]))
q.replace({{}})
i = 0
while True:
    q.update({{f"w{{i}}": ("waiting", {{"id": f"w{{i}}", "key": "k", "pad": "x" * (i % 300)}})}})
    if i >= 5:
        q.update({{f"w{{i - 5}}": None}})
    print(i, flush=True)
    i += 1
"""


def test_a_writer_killed_by_sigkill_loses_nothing_it_acknowledged(tmp_path):
    path = tmp_path / "queue.json"
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        acked = -1
        while acked < 700:  # past a few compactions
            acked = int(writer.stdout.readline())
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    rest = writer.stdout.read().split()
    last = int(rest[-1]) if rest else acked
    data, problem = store.load(path)
    ids = [w["id"] for w in data["waiting"]]
    # every acknowledged state is there; at most the one update in flight is missing or present
    assert problem in (None, f"{tmp_path / 'queue.journal'}: a torn last line was skipped")
    assert ids in (
        [f"w{i}" for i in range(last - 4, last + 1)],
        [f"w{i}" for i in range(last - 4, last + 2)],
        [f"w{i}" for i in range(last - 3, last + 2)],
    )


# -- a full disk: an append is whole or not at all ----------------------------------


def test_a_journal_append_a_full_disk_cuts_short_is_undone_and_written_whole_later():
    with small_tmpfs("1m") as root:
        queue = store.QueueFile(root / "queue.json")
        queue.update({"a": ("waiting", {"id": "a", "key": "codex"})})
        journal = root / "queue.journal"
        before = journal.read_bytes()
        big = {"b": ("waiting", {"id": "b", "key": "codex", "pad": "y" * 20000})}
        with full(root):
            with pytest.raises(OSError) as failed:  # the page's room was taken, the rest refused
                queue.update(big)
            assert failed.value.errno == errno.ENOSPC and failed.value.filename == str(journal)
            assert journal.read_bytes() == before  # no torn line left
            assert set(queue.entries) == {"a"}  # and nothing counted as saved
        queue.update(big)  # room again: the same change is written whole
        assert [w["id"] for w in store.read_queue(root / "queue.json")["waiting"]] == ["a", "b"]


def test_a_finished_line_a_full_disk_cuts_short_is_undone():
    with small_tmpfs("1m") as root:
        path = root / "finished.log"
        store.append_finished(path, "t1", "released", 1.0)
        with full(root):
            with pytest.raises(OSError):
                store.append_finished(path, "t" * 9000, "released", 2.0)
            assert path.read_text() == "t1 released 1.000\n"
        assert store.load_finished(path) == ({"t1": ("released", 1.0)}, 0)


def test_finished_lines_keep_a_turns_end_and_read_older_and_torn_lines(tmp_path):
    """`<id> <state> <epoch> [<end>]`: a line of an older build has no end; a torn end is
    skipped as a torn line is; an end's fields are kept as written (newer ones too)."""
    path = tmp_path / "finished.log"
    end = {"key": "k", "exit": {"code": 3, "signal": None, "reason": None}, "exited_at": 5.5}
    store.append_finished(path, "t1", "released", 6.0, end={**end, "newer": [1]})
    with open(path, "a") as f:
        f.write("t0 cancelled 1.000\n")  # an older build's line
        f.write('t2 released 7.000 {"key": "k", "exit"\n')  # torn inside its end
        f.write("t3 released 8.000 [1]\n")  # an end that is not an object
    ends: dict = {}
    finished, skipped = store.load_finished(path, ends)
    assert finished == {"t1": ("released", 6.0), "t0": ("cancelled", 1.0)} and skipped == 2
    assert ends == {"t1": {**end, "newer": [1]}}
    store.rewrite_finished(path, finished, ends)
    again: dict = {}
    assert store.load_finished(path, again) == (finished, 0) and again == ends
