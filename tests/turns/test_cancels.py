"""Cancel in every state, without processes: a queued turn takes nothing, a running one stops and
still releases only when gone."""

from __future__ import annotations

import pytest
from fakes import (
    END,
    RUN,
    no_process_left,  # noqa: F401 (an autouse fixture)
    scenario,
)

from supervisor.wire.protocol import ProtocolError

# -- cancel in every state -------------------------------------------------------------------------


@scenario()
async def test_cancel_while_queued_takes_nothing(h):
    h.turn("t1")
    h.turn("t2")
    assert h.manager.cancel("t2") == {"id": "t2", "state": "cancelled"}
    assert h.events("t2") == ["queued", "cancelled"]
    assert h.body("turn.t2.cancelled")["reason"] == "cancelled"
    assert h.saved()["waiting"] == []
    await h.end("t1")
    assert h.held() == {}


@scenario()
async def test_cancel_while_running_stops_and_releases_only_when_gone(h):
    h.turn("t1")
    assert h.manager.cancel("t1") == {"id": "t1", "state": "stopping"}
    assert h.events("t1") == RUN + ["stopping"]
    assert h.guard("t1").terminated == 1
    assert h.held() == {"codex": ["t1"]}
    await h.end("t1", 143, exit={"code": None, "signal": 15})
    assert h.events("t1") == RUN + ["stopping"] + END
    assert h.held() == {}


@scenario()
async def test_cancel_while_stopping_or_exited_asks_again_and_publishes_nothing(h):
    h.turn("t1")
    h.manager.cancel("t1")
    h.manager.cancel("t1")
    assert h.guard("t1").terminated == 2
    assert h.manager.cancel("t1") == {"id": "t1", "state": "stopping"}
    assert h.guard("t1").terminated == 3
    assert h.events("t1") == RUN + ["stopping"]


@scenario()
async def test_cancel_after_the_outcome_is_known_asks_the_guard_again(h):
    h.turn("t1")
    h.guard("t1").write_record(exit={"code": 0, "signal": None})
    h.manager.on_guard_hint("guard.t1.exited", {})
    assert h.manager.cancel("t1") == {"id": "t1", "state": "exited"}
    assert h.guard("t1").terminated == 1
    assert h.events("t1") == RUN + ["exited"]


@scenario()
async def test_cancel_of_a_finished_or_unknown_id(h):
    h.turn("t1")
    await h.end("t1")
    before = list(h.published)
    assert h.manager.cancel("t1") == {"id": "t1", "state": "released", "finished": True}
    assert h.published == before
    with pytest.raises(ProtocolError) as caught:
        h.manager.cancel("nope")
    assert caught.value.code == "not_found"


@scenario()
async def test_cancel_of_a_waiting_reservation_and_of_a_held_one(h):
    h.reserve("r1")
    h.reserve("r2", holder={"session": "s2"})
    assert h.manager.cancel("r2")["state"] == "cancelled"
    assert h.events("r2") == ["queued", "cancelled"]
    assert h.manager.cancel("r1")["state"] == "released"
    assert h.events("r1") == ["queued", "granted", "released"]
    assert h.body("turn.r1.released") == {
        "id": "r1",
        "key": "codex",
        "reservation": True,
        "reason": "cancelled",
        "index": 0,
    }
    assert h.held() == {}


@scenario()
async def test_a_cancel_that_arrives_while_the_guard_starts_stops_it_once_started(h):
    answers = []
    h.starter.during = lambda: answers.append(h.manager.cancel("t1"))
    h.turn("t1")
    assert answers == [{"id": "t1", "state": "granted"}]
    assert h.events("t1") == RUN + ["stopping"]
    assert h.guard("t1").terminated == 1


@scenario()
async def test_shutdown_cancels_waiters_releases_reservations_and_stops_turns(h):
    h.gate.caps["claude"] = 1
    h.turn("t1")
    h.turn("t2")
    h.reserve("r1", key="claude")
    h.manager.begin_stop()
    assert h.events("t2") == ["queued", "cancelled"]
    assert h.events("r1")[-1] == "released"
    assert h.events("t1") == RUN + ["stopping"]
    assert {
        h.body(f"turn.{i}.{e}")["reason"]
        for i, e in [("t2", "cancelled"), ("r1", "released"), ("t1", "stopping")]
    } == {"shutdown"}
    with pytest.raises(ProtocolError):
        h.turn("t3")
    await h.end("t1", 143)
    assert h.manager.ledger.idle.is_set()
