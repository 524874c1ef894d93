"""Log retention (supervisor.output.retention) and the time index beside each log (supervisor.output.line_times).

Real files in a temporary state directory, their ages set with os.utime; a `running` set stands
for the supervisor's running turns.
"""

from __future__ import annotations

import json
import os

import pytest

from supervisor.config.logs import LogLimits
from supervisor.output import line_times
from supervisor.output.retention import MARKER, QUIET, marker_of, prune

NOW = 1_000_000.0
DAY = 86400.0


def make_turn(turns, turn_id: str, size: int, age: float):
    path = turns / turn_id
    path.mkdir(parents=True)
    for name, data in (("stdout.log", b"o" * size), ("stderr.log", b""), ("stdout.idx", b"")):
        (path / name).write_bytes(data)
        os.utime(path / name, (NOW - age, NOW - age))
    return path


@pytest.fixture
def turns(tmp_path):
    return tmp_path / "turns"


def test_keep_prunes_turns_older_than_the_age_and_leaves_a_marker(turns):
    old = make_turn(turns, "old", 100, 8 * DAY)
    make_turn(turns, "young", 100, 1 * DAY)
    pruned = prune(turns, LogLimits(keep=7 * DAY), running=set(), now=NOW)
    assert [(p["id"], p["reason"], p["bytes"]) for p in pruned] == [("old", "keep", 100)]
    assert sorted(os.listdir(old)) == [MARKER]
    assert marker_of(old) == {"v": 1, "pruned_at": NOW, "reason": "keep", "bytes": 100}
    assert marker_of(turns / "young") is None
    assert prune(turns, LogLimits(keep=7 * DAY), running=set(), now=NOW) == []  # runs again
    # the marker goes once it is older than keep itself
    prune(turns, LogLimits(keep=7 * DAY), running=set(), now=NOW + 8 * DAY)
    assert not old.exists()


def test_max_bytes_prunes_oldest_first_until_the_rest_fits(turns):
    for n, age in enumerate([5, 4, 3, 2]):
        make_turn(turns, f"t{n}", 100, age * DAY)
    pruned = prune(turns, LogLimits(max_bytes=250), running=set(), now=NOW)
    assert [p["id"] for p in pruned] == ["t0", "t1"]
    assert [p["reason"] for p in pruned] == ["max_bytes", "max_bytes"]
    assert sum(f.stat().st_size for f in turns.rglob("*.log")) == 200


def test_a_running_or_just_written_turn_is_never_pruned_even_past_max_bytes(turns):
    make_turn(turns, "running", 1000, 30 * DAY)
    make_turn(turns, "fresh", 1000, QUIET / 2)
    make_turn(turns, "done", 10, 2 * DAY)
    pruned = prune(turns, LogLimits(keep=DAY, max_bytes=100), running={"running"}, now=NOW)
    assert [p["id"] for p in pruned] == ["done"]
    assert (turns / "running" / "stdout.log").stat().st_size == 1000
    assert (turns / "fresh" / "stdout.log").stat().st_size == 1000


def test_a_prune_stopped_half_way_is_finished_next_time(turns):
    path = make_turn(turns, "half", 100, 9 * DAY)
    (path / MARKER).write_text(
        json.dumps({"v": 1, "pruned_at": NOW, "reason": "keep", "bytes": 100})
    )
    prune(turns, LogLimits(keep=7 * DAY), running=set(), now=NOW + 1)
    assert sorted(os.listdir(path)) == [MARKER]


def test_no_limits_prune_nothing_and_strange_entries_are_skipped(turns):
    make_turn(turns, "a", 100, 100 * DAY)
    (turns / "not a turn id!").mkdir()
    (turns / "file").write_text("x")
    assert prune(turns, LogLimits(), running=set(), now=NOW) == []
    assert prune(turns.parent / "missing", LogLimits(keep=1.0), running=set(), now=NOW) == []


def test_timed_chunks_pair_the_index_with_the_log_and_survive_a_torn_index(tmp_path):
    log, index = tmp_path / "stdout.log", tmp_path / "stdout.idx"
    log.write_bytes(b"hello world\nbye\n")
    index.write_bytes(
        line_times.entry(0, 10.0)
        + line_times.entry(6, 11.0)
        + line_times.entry(12, 12.0)
        + b"\x01\x02"
    )
    assert list(line_times.timed_chunks(log, index)) == [
        (10.0, b"hello "),
        (11.0, b"world\n"),
        (12.0, b"bye\n"),
    ]
    index.write_bytes(
        line_times.entry(6, 11.0) + line_times.entry(2, 9.0) + line_times.entry(99, 13.0)
    )
    assert list(line_times.timed_chunks(log, index)) == [
        (None, b"hello "),  # before the first entry: no time
        (11.0, b"world\nbye\n"),  # out of order and past the end: skipped
    ]
    index.unlink()
    assert list(line_times.timed_chunks(log, index)) == [(None, b"hello world\nbye\n")]


def test_timed_lines_stamp_each_line_with_the_time_its_first_byte_came():
    chunks = [(10.0, b"one\ntw"), (11.0, b"o\nthree"), (12.0, b"\n"), (13.0, b"\nlast")]
    out = b"".join(line_times.timed_lines(chunks))
    s10, s11, s13 = (line_times.stamp(t) for t in (10.0, 11.0, 13.0))
    assert out == s10 + b"one\n" + s10 + b"two\n" + s11 + b"three\n" + s13 + b"\n" + s13 + b"last"
    # without the stamps, the bytes are the log's
    assert out.replace(s10, b"").replace(s11, b"").replace(s13, b"") == b"".join(
        c for _, c in chunks
    )
