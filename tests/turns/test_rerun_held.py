"""Which turns a dead supervisor left granted are held for their requesters (supervisor.turns.rerun):
only those of which nothing ran or runs. Each case is one piece of evidence that something of the
turn may have run; with it the turn is not held (it ends as a lost one), without it it is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import wait_until

from guardd.record import SCOPE_ENV, TURN_ENV, record_dir_scope
from supervisor.caps import SlotState
from supervisor.slots.record import SlotView
from supervisor.turns.rerun import held_ones

# A turn id of this run alone: the check looks at every process on the machine, and other tests
# (a parallel run's) have turns named t1.
T1 = f"t1-{uuid.uuid4().hex}"
ENTRY = {"id": T1, "key": "codex", "argv": ["true"], "holder": {}, "requested_at": 1.0}


def held(tmp_path: Path, views=(), entry=ENTRY) -> list[str]:
    manager = SimpleNamespace(paths=SimpleNamespace(guards=tmp_path / "guards"))
    (tmp_path / "guards").mkdir(exist_ok=True)
    return [e["id"] for e in held_ones(manager, [dict(entry)], list(views))]  # type: ignore[arg-type]


def guard_record(tmp_path: Path, **fields) -> None:
    (tmp_path / "guards").mkdir(exist_ok=True)
    record = {"v": 1, "turn": T1, "state": "running", "own_group": {"pgid": 5}, **fields}
    (tmp_path / "guards" / "5-1.json").write_text(json.dumps(record))


def test_a_turn_of_which_nothing_is_known_is_held(tmp_path):
    assert held(tmp_path) == [T1]


@pytest.mark.parametrize(
    "state, work",
    [
        (SlotState.ORPHANED, {"guard": None, "cgroup": "/x"}),  # its cgroup holds something
        (SlotState.UNREADABLE, None),
        (SlotState.FREE, {"guard": {"pid": 5, "start": 1}, "record": "r"}),  # a guard ran
    ],
)
def test_a_turn_whose_slot_shows_work_or_a_guard_is_not_held(tmp_path, state, work):
    view = SlotView("codex", 0, 1, state, turn=T1, record={"work": work})
    assert held(tmp_path, [view]) == []


def test_a_free_slot_that_names_no_guard_keeps_it_held(tmp_path):
    view = SlotView("codex", 0, 1, SlotState.FREE, turn=T1, record={"work": None})
    assert held(tmp_path, [view]) == [T1]


@pytest.mark.parametrize(
    "fields",
    [
        {},  # running
        {"state": "gone", "reason": "exited", "exit": {"code": 0}},  # ran and ended
        {"state": "gone", "reason": "parent_gone"},  # ran (an own group), ended with its parent
    ],
)
def test_a_guard_record_of_the_turn_keeps_it_from_being_held(tmp_path, fields):
    guard_record(tmp_path, **fields)
    assert held(tmp_path) == []


def test_a_guard_record_that_says_cmd_was_not_run_keeps_it_held(tmp_path):
    guard_record(tmp_path, state="gone", reason="parent_gone", own_group=None, exit={"code": 125})
    assert held(tmp_path) == [T1]


def test_an_unreadable_guard_record_keeps_every_turn_from_being_held(tmp_path):
    (tmp_path / "guards").mkdir()
    (tmp_path / "guards" / "5-1.json").write_text("{not json")
    assert held(tmp_path) == []


def test_a_terminal_turn_is_not_held(tmp_path):
    assert held(tmp_path, entry={**ENTRY, "stdin": "tty"}) == []


@pytest.mark.timeout(30)
@pytest.mark.parametrize("how", ["title", "marker"])
def test_a_live_process_of_the_turn_keeps_it_from_being_held(tmp_path, how):
    """A guard (the turn's id in its command line) or its command (CCSUP_TURN, of this state
    directory's scope) still alive: it may run or have run the command."""
    (tmp_path / "guards").mkdir()
    ready = tmp_path / "ready"
    script = f"open({str(ready)!r}, 'w').close(); import time; time.sleep(30)"
    if how == "title":
        argv, env = [sys.executable, "-c", script, f"ccsup-guard {T1}"], dict(os.environ)
    else:
        scope = record_dir_scope(tmp_path / "guards")
        argv = [sys.executable, "-c", script]
        env = {**os.environ, TURN_ENV: T1, SCOPE_ENV: str(scope)}
    proc = subprocess.Popen(argv, env=env)
    try:
        wait_until(ready.exists, 20, what="the process's start")  # its argv and env in place
        assert held(tmp_path) == []
    finally:
        proc.kill()
        proc.wait()
    assert held(tmp_path) == [T1]
