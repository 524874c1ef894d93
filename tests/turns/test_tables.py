"""The tables themselves: every phase says what a cancel does, and an illegal pair raises."""

from __future__ import annotations

import asyncio

import pytest
from fakes import (
    RUN,
    Harness,
    no_process_left,  # noqa: F401 (an autouse fixture)
    scenario,
)

from guardd.procs import Group
from supervisor.holder import Holder
from supervisor.turns.endings import ACTIONS, Action, Phase, What
from supervisor.turns.states import IllegalTransition
from supervisor.wire.protocol import ProtocolError

# -- the table itself ------------------------------------------------------------------------------


def test_every_phase_says_what_a_cancel_does_and_an_illegal_pair_raises(tmp_path):
    assert {phase for phase, what in ACTIONS if what is What.CANCEL} == set(Phase)
    assert {phase for phase, what in ACTIONS if what is What.GUARD_ENDED} == set(Phase) - {
        Phase.WAITING,
        Phase.AWAITING,
        Phase.HELD,
        Phase.STARTING,
    }

    async def body(h):
        h.turn("t1")
        turn = h.manager.turns["t1"]
        assert set(h.manager.endings._run) == set(Action) - {Action.NOTHING}
        with pytest.raises(IllegalTransition, match="t1 in phase running cannot take start_failed"):
            h.manager.endings.happen(turn, What.START_FAILED, reason="x")

    asyncio.run(body(Harness(tmp_path)))


@scenario(caps={"codex": 1, "claude": 1})
async def test_an_admission_policy_holds_a_key_back_and_others_go_on(h):
    from supervisor.turns.manager import Refusal

    class PauseCodex:
        paused = True

        def refusal(self, item, now):
            return Refusal("paused", now + 5) if self.paused and item.key == "codex" else None

    h.manager.admission = policy = PauseCodex()
    h.turn("t1")
    h.turn("c1", key="claude")
    assert h.events("t1") == ["queued"] and h.events("c1") == RUN
    assert h.manager.refused == {"codex": Refusal("paused", h.clock.now + 5)}
    policy.paused = False
    h.manager.tick()
    assert h.events("t1") == RUN and h.manager.refused == {}


@scenario()
async def test_send_writes_to_a_running_turn_only(h):
    from supervisor.wire.args import parse_send

    h.turn("t1")
    h.turn("t2")
    assert h.manager.send(parse_send({"id": "t1", "data": "hi"})) == {
        "id": "t1",
        "written": 2,
        "pending": 0,
    }
    assert h.guard("t1").stdin == b"hi"
    with pytest.raises(ProtocolError, match="t2 is queued"):
        h.manager.send(parse_send({"id": "t2", "data": "hi"}))


@scenario()
async def test_stdin_sent_while_the_guard_starts_reaches_it_first_in_order(h):
    from supervisor.wire.args import parse_send

    h.starter.hold = True  # the zygote has not answered yet: the turn is granted, not running
    h.turn("t1")
    assert h.events("t1") == ["queued", "granted"]
    assert h.manager.send(parse_send({"id": "t1", "data": "a"})) == {
        "id": "t1",
        "written": 1,
        "pending": 1,
    }
    assert h.manager.send(parse_send({"id": "t1", "data": "b", "eof": True}))["pending"] == 2
    with pytest.raises(ProtocolError, match="stdin of turn t1 is closed"):
        h.manager.send(parse_send({"id": "t1", "data": "c"}))
    h.starter.pending["t1"].settle()
    assert h.events("t1")[-1] == "started"
    assert (h.guard("t1").stdin, h.guard("t1").stdin_eof) == (b"ab", True)


@scenario()
async def test_stdin_sent_after_the_guard_started_but_before_started_reaches_it(h):
    """`started` waits for the guard's record (its start pipe): a send in between goes to the
    guard's stdin, as the Node sidecar's send right after its turn's answer does."""
    from supervisor.wire.args import parse_send

    h.starter.ready_later = True
    h.turn("t1")
    assert h.events("t1") == ["queued", "granted"]
    assert h.manager.send(parse_send({"id": "t1", "data": "hi", "eof": True}))["written"] == 2
    assert (h.guard("t1").stdin, h.guard("t1").stdin_eof) == (b"hi", True)
    h.guard("t1").ready()
    assert h.events("t1")[-1] == "started"


def test_the_holder_type_round_trips_as_a_slot_record_and_a_request_gives_it():
    from supervisor.wire.args import parse_holder

    holder = parse_holder({"session": "s", "pid": 5})
    assert holder == Holder(pid=5, session="s")
    held = holder.held_by(9, 10)
    assert Holder.from_json(held.to_json()) == held == Holder(9, 10, session="s")
    assert Group(1, None) == Group(1, None)  # groups are values (the fakes compare them)
