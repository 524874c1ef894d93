"""Requests and grants, without processes: scripted histories against the fakes."""

from __future__ import annotations

import os
import shutil

from fakes import (
    END,
    NO_USAGE,
    RUN,
    no_process_left,  # noqa: F401 (an autouse fixture)
    scenario,
)

from supervisor.guards.handle import LOG_FILES
from supervisor.holder import Holder

# -- request and grant -----------------------------------------------------------------------------


@scenario()
async def test_a_request_with_a_free_slot_is_granted_and_started(h):
    assert h.turn("t1") == {"id": "t1", "state": "running", "position": None}
    assert h.events("t1") == RUN
    assert h.held() == {"codex": ["t1"]}
    assert [(e["id"], e["key"]) for e in h.saved()["running"]] == [("t1", "codex")]
    assert h.body("turn.t1.started")["guard"] == h.guard("t1").identity.to_json()


@scenario()
async def test_a_request_for_a_full_key_waits_and_holds_nothing(h):
    h.turn("t1")
    assert h.turn("t2") == {"id": "t2", "state": "queued", "position": 1}
    assert h.events("t2") == ["queued"]
    assert h.held() == {"codex": ["t1"]}
    assert [w["id"] for w in h.saved()["waiting"]] == ["t2"]


@scenario()
async def test_a_waiting_turn_has_its_log_files_made_ahead_and_its_start_makes_them_again(h):
    files = h.manager.ledger.files
    asked: list[str] = []
    real_make_soon = files.make_soon
    files.make_soon = lambda d, names: asked.append(str(d)) or real_make_soon(d, names)
    h.turn("t1")
    h.turn("t2")
    assert h.manager.ledger.files.drain()
    t2 = h.paths.turn_dir("t2")
    assert sorted(p.name for p in t2.iterdir()) == sorted(LOG_FILES)  # made while it waits
    assert {p.stat().st_size for p in t2.iterdir()} == {0}
    assert t2.stat().st_mode & 0o777 == 0o700
    shutil.rmtree(t2)  # gone before its start (pruned, say): the start makes them again
    await h.end("t1", 0)
    assert h.events("t2") == RUN
    assert t2.is_dir()  # (the fake guard opens no files; a real one creates what is missing)
    assert asked.count(str(t2)) == 1  # asked of the file thread once: while it waited


@scenario()
async def test_a_normal_end_releases_and_grants_the_next_waiter(h):
    h.turn("t1")
    h.turn("t2")
    await h.end("t1", 0)
    assert h.events("t1") == RUN + END
    assert h.body("turn.t1.exited") == {
        "id": "t1",
        "key": "codex",
        "code": 0,
        "signal": None,
        "reason": None,
        **NO_USAGE,
    }
    assert h.events("t2") == RUN
    assert h.held() == {"codex": ["t2"]}
    assert not h.guard("t1").record_path.exists()  # reaped and gone: the record is dropped


@scenario()
async def test_a_signal_in_the_record_is_reported_as_a_shell_would(h):
    h.turn("t1")
    await h.end("t1", 137, exit={"code": None, "signal": 9})
    assert {k: h.body("turn.t1.exited")[k] for k in ("code", "signal")} == {
        "code": 137,
        "signal": 9,
    }
    assert h.held() == {}


@scenario()
async def test_the_guard_status_serves_when_the_record_has_no_exit(h):
    h.turn("t1")
    h.guard("t1").end(3, exit=None, state="gone")
    await h.settle()
    assert h.body("turn.t1.exited")["code"] == 3
    assert h.events("t1") == RUN + END


@scenario(caps={"codex": 1, "claude": 1})
async def test_a_full_key_does_not_block_another_key(h):
    h.turn("t1")
    h.turn("t2")
    h.turn("c1", key="claude")
    assert h.events("c1") == RUN
    assert h.held() == {"claude": ["c1"], "codex": ["t1"]}


@scenario()
async def test_waiters_are_granted_oldest_first_and_a_new_request_never_jumps(h):
    h.turn("t1")
    for name in ["w1", "w2", "w3"]:
        h.clock.advance(1)
        h.turn(name)
    await h.end("t1")
    h.clock.advance(1)
    h.turn("late")  # a slot is busy again, and older waiters remain
    assert h.held() == {"codex": ["w1"]}
    for name in ["w1", "w2"]:
        await h.end(name)
    assert h.held() == {"codex": ["w3"]}
    assert [t for t in h.events() if t.endswith(".granted")] == [
        f"turn.{n}.granted" for n in ["t1", "w1", "w2", "w3"]
    ]


@scenario()
async def test_a_known_id_is_answered_and_never_run_twice(h):
    h.turn("t1")
    assert h.turn("t1")["state"] == "running"
    await h.end("t1")
    assert h.turn("t1") == {"id": "t1", "state": "released", "position": None}
    assert h.events("t1") == RUN + END
    assert list(h.starter.guards) == ["t1"]


@scenario()
async def test_the_slot_record_names_the_supervisor_with_the_requesters_labels(h):
    h.requesters.alive.add(4242)
    h.turn("t1", holder={"session": "s", "agent": "a", "pid": 4242})
    assert h.gate.holders == [Holder(os.getpid(), 1, session="s", agent="a")]


# -- a gate that fails for one key ------------------------------------------------


def _errors(h) -> list[dict]:
    return [b for t, b in h.published if t == "supervisor.error"]


@scenario(caps={"a": 1, "b": 1})
async def test_a_gate_error_for_one_key_strands_no_grant_of_the_pass_and_the_request_waits(h):
    h.turn("a1", key="a")
    assert h.turn("a2", key="a")["state"] == "queued"
    h.gate.failing["b"] = OSError(40, "Too many levels of symbolic links", "/s/slots/b/slot-0.lock")
    assert h.turn("b1", key="b") == {"id": "b1", "state": "queued", "position": 1}
    (error,) = _errors(h)
    assert error["key"] == "b" and "/s/slots/b/slot-0.lock" in error["message"], error
    assert h.manager.refused["b"].reason == "unreadable"
    # a1 ends: the pass grants a2 (key a is older) and then meets b's error: a2 is started.
    await h.end("a1", 0)
    assert h.events("a2") == RUN
    assert h.held() == {"a": ["a2"]}
    h.manager.tick()
    h.manager.tick()
    assert len(_errors(h)) == 1  # said once, not at every retry
    assert h.events("b1") == ["queued"]
    del h.gate.failing["b"]
    h.manager.tick()  # repaired: the periodic retry grants it
    assert h.events("b1") == RUN
    assert "b" not in h.manager.gate_errors


@scenario(caps={"a": 1, "b": 1})
async def test_a_full_disk_under_a_new_keys_first_record_leaves_it_waiting_and_other_keys_run(h):
    from supervisor.errors import os_failure

    h.gate.failing["b"] = os_failure(
        "write slot record", "/s/slots/b/slot-0.json", OSError(28, "No space left on device")
    )
    assert h.turn("b1", key="b")["state"] == "queued"
    assert h.turn("a1", key="a")["state"] == "running"  # the next pass meets b first, then a
    assert "No space left on device" in _errors(h)[0]["message"]
    h.manager.begin_stop()  # nothing stranded: a stop cancels the waiter and ends a1
    assert h.events("b1") == ["queued", "cancelled"]
