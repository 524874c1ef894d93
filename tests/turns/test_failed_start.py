"""A failed start, without processes: a guard nobody watched (the bug this file pins) never
happens again."""

from __future__ import annotations

import errno

from fakes import (
    END,
    RUN,
    no_process_left,  # noqa: F401 (an autouse fixture)
    scenario,
)

# -- a failed start (the bug: a running guard nobody watched) --------------------------------------


@scenario()
async def test_a_guard_that_cannot_start_ends_the_turn_and_frees_the_slot(h):
    h.starter.error = OSError(errno.ENOENT, "No such file or directory")
    h.turn("t1")
    h.turn("t2")
    assert h.events("t1") == ["queued", "granted"] + END
    assert (
        h.body("turn.t1.exited")["reason"] == "unable to start the guard: No such file or directory"
    )
    assert h.events("t2") == ["queued", "granted"] + END  # each waiter tried, none stuck


@scenario()
async def test_an_unwritable_turns_directory_fails_before_any_guard_starts(h):
    h.paths.turns.rmdir()
    h.paths.turns.write_text("not a directory")  # mkdir fails for root too
    h.turn("t1")
    assert h.starter.guards == {}
    assert h.events("t1") == ["queued", "granted"] + END
    assert h.body("turn.t1.exited")["reason"].startswith(
        "unable to create the turn's log directory"
    )
    assert h.held() == {}


@scenario()
async def test_a_slot_record_that_cannot_be_written_stops_the_started_guard(h):
    h.gate.record_work_error = OSError(errno.ENOSPC, "No space left on device")
    h.turn("t1")
    assert h.events("t1") == RUN + ["stopping"]
    assert "unable to record the work of turn t1" in h.body("turn.t1.stopping")["reason"]
    assert h.guard("t1").terminated == 1
    assert h.held() == {"codex": ["t1"]}  # held until its work is confirmed gone
    h.gate.record_work_error = None
    await h.end("t1", 143)
    assert h.events("t1") == RUN + ["stopping"] + END
    assert h.held() == {}


@scenario()
async def test_a_guard_whose_pipes_cannot_be_followed_is_stopped_and_watched_by_tick(h):
    h.starter.attach_error = OSError(errno.EMFILE, "Too many open files")
    h.turn("t1")
    assert h.events("t1") == RUN + ["stopping"]
    assert h.guard("t1").terminated == 1
    h.guard("t1").end(143, exit={"code": None, "signal": 15})  # no exit callback: not attached
    h.manager.tick()  # its pid runs nothing: the tick sees it ended
    await h.settle()
    assert h.events("t1") == RUN + ["stopping"] + END
    assert h.held() == {}
