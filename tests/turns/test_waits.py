"""Waits, reservations and requesters, without processes: fairness, binding, expiry and a
requester that dies."""

from __future__ import annotations

import pytest
from fakes import (
    HOLDER,
    RUN,
    no_process_left,  # noqa: F401 (an autouse fixture)
    scenario,
)

from supervisor.wire.protocol import ProtocolError

# -- waits, reservations, requesters ---------------------------------------------------------------


@scenario()
async def test_a_wait_timeout_cancels_a_waiter_but_never_a_granted_turn(h):
    h.turn("t1", wait_timeout=5)
    h.turn("t2", wait_timeout=5)
    h.clock.advance(5)
    assert h.events("t2") == ["queued", "cancelled"]
    assert h.body("turn.t2.cancelled")["reason"] == "timeout"
    assert h.events("t1") == RUN


@scenario(ttl=30.0)
async def test_a_held_reservation_expires_and_its_slot_goes_to_the_next_waiter(h):
    assert h.reserve("r1")["state"] == "held"
    h.turn("t1")
    h.clock.advance(29.9)
    assert h.events("r1") == ["queued", "granted"]
    h.clock.advance(0.1)
    assert h.events("r1") == ["queued", "granted", "released"]
    assert h.body("turn.r1.released")["reason"] == "expired"
    assert h.held() == {"codex": ["t1"]}


@scenario()
async def test_asking_again_for_a_reservation_returns_the_same_one_and_never_extends_it(h):
    first = h.reserve("r1")
    h.clock.advance(10)
    again = h.reserve("r-other")
    assert again == first and again["until"] == h.clock.now - 10 + 60


@scenario()
async def test_a_turn_binding_a_held_reservation_takes_its_slot_without_waiting(h):
    h.reserve("r1")
    assert h.turn("t1", reservation="r1", holder=HOLDER)["state"] == "running"
    assert h.events("r1") == ["queued", "granted", "released"]
    assert h.body("turn.r1.released")["reason"] == "bound"
    assert h.events("t1") == RUN
    assert h.body("turn.t1.granted") == {
        "id": "t1",
        "key": "codex",
        "index": 0,
        "reservation": "r1",
    }
    assert h.held() == {"codex": ["t1"]}
    h.clock.advance(120)  # the reservation's timer is gone with it
    assert h.events("t1") == RUN


@scenario()
async def test_a_turn_binding_a_waiting_reservation_takes_its_place_in_the_queue(h):
    h.turn("t0")
    h.clock.advance(1)
    h.reserve("r1")
    h.clock.advance(1)
    h.turn("t2")
    h.clock.advance(1)
    h.turn("t1", reservation="r1", holder=HOLDER)
    assert h.events("r1") == ["queued", "cancelled"]
    assert [w.id for w in h.manager.queue.all()] == ["t1", "t2"]
    assert {w["id"]: w["requested_at"] for w in h.saved()["waiting"]}["t1"] == h.clock.now - 2
    await h.end("t0")
    assert h.held() == {"codex": ["t1"]}


@scenario()
async def test_a_dead_requester_cancels_its_waiters_and_stops_its_turns(h):
    h.requesters.alive.add(77)
    h.turn("t1", holder={"pid": 77})
    h.turn("t2", holder={"pid": 77})
    h.requesters.die(77)
    assert h.events("t1") == RUN + ["stopping"]
    assert h.events("t2") == ["queued", "cancelled"]
    assert h.body("turn.t2.cancelled")["reason"] == "requester_gone"
    with pytest.raises(ProtocolError):
        h.turn("t3", holder={"pid": 77})
