"""Admission through the manager, without processes: the manager-logic harness (fake gate, guards,
clock and timers) with a real KeyControl made by the manager, as the daemon has it made."""

from __future__ import annotations

import asyncio
import os
import re

import pytest
from fakes import RUN, Harness, no_process_left, scenario  # noqa: F401 (an autouse fixture)

from guardd.procs import Identity
from supervisor.admission.control import START_SLACK, KeyControl
from supervisor.config.admission import AdmissionSettings, PauseRule, Rate
from supervisor.turns.fairness import make_ordering
from supervisor.turns.manager import Manager, Settings, Turns
from supervisor.wire.args import parse_pause, parse_resume


def with_keyctl(h: Harness, **settings) -> KeyControl:
    """Replace the harness's manager by one with admission, as supervisor.daemon.main makes it.
    The quota readers are off (their thread answers an ended turn a moment later, which a fake
    clock does not wait for): tests/admission/test_quota_readers.py has them."""
    settings.setdefault("quota_read", frozenset())
    chosen = AdmissionSettings(**settings)
    made: list[KeyControl] = []

    def admission(turns: Turns) -> KeyControl:
        made.append(
            KeyControl(
                chosen,
                h.paths.root,
                turns,
                publish=lambda topic, body: h.published.append((topic, body)),
                clock=h.clock,
                timers=h.clock,
            )
        )
        return made[0]

    h.manager = Manager(
        paths=h.paths,
        gate=h.gate,
        publish=lambda topic, body: h.published.append((topic, body)),
        settings=Settings(0.1, 0.1, None, "test", reservation_ttl=h.ttl),
        clock=h.clock,
        start_guard=h.starter,
        timers=h.clock,
        requesters=type(h.requesters),
        probe=h.probe,
        me=Identity(os.getpid(), 1),
        admission=admission,
        ordering=make_ordering(chosen.fairness),
    )
    (keyctl,) = made
    h.requesters = h.manager.requesters
    h.requesters.alive = h.alive
    keyctl.restore()
    return keyctl


@scenario(caps={"codex": 1, "claude": 1})
async def test_a_pause_holds_the_key_and_its_end_grants_the_waiters_in_order(h):
    keyctl = with_keyctl(h)
    keyctl.pause(parse_pause({"key": "codex", "for": 30, "reason": "429"}), by="control")
    for turn_id in ("t1", "t2"):
        h.turn(turn_id)
    h.turn("c1", key="claude")
    assert h.events("t1") == ["queued"] and h.events("c1") == RUN
    assert h.manager.refused["codex"].reason == "paused"
    h.clock.advance(29.9)
    assert h.events("t1") == ["queued"]
    h.clock.advance(0.1)  # the pause's own timer: resumed, then the head is granted
    assert [t for t in h.events() if t.startswith("key.")] == [
        "key.codex.paused",
        "key.codex.resumed",
    ]
    assert h.events("t1") == RUN and h.events("t2") == ["queued"]
    await h.end("t1")
    assert h.events("t2") == RUN


@scenario(caps={"codex": 5})
async def test_a_rate_admits_n_per_window_and_its_timer_admits_the_next(h):
    keyctl = with_keyctl(h, rates={"codex": Rate(2, 10.0)})
    for i in range(4):
        h.turn(f"t{i}")
    assert [h.events(f"t{i}") == RUN for i in range(4)] == [True, True, False, False]
    # counted from their start (plus START_SLACK for the commands' own exec), not their grant
    opens = h.clock.now + 10 + START_SLACK
    assert h.manager.refused["codex"].reason == "rate"
    assert h.manager.refused["codex"].until == opens
    h.clock.advance(10)
    assert [h.events(f"t{i}") == RUN for i in range(4)] == [True, True, False, False]
    h.clock.advance(START_SLACK)
    assert [h.events(f"t{i}") == RUN for i in range(4)] == [True, True, True, True]
    next_allowed = keyctl.policy.starts.next_allowed("codex", h.clock.now)
    assert next_allowed == pytest.approx(opens + START_SLACK + 10)


@scenario(caps={"codex": 5})
async def test_a_rate_held_head_waits_for_the_window_its_grants_started_moved(h):
    """The window counts from each grant's start: a start after the head was refused moves the
    head's hold, and what `ps` says of the head and of its key stay the same moment."""
    keyctl = with_keyctl(h, rates={"codex": Rate(2, 10.0)})
    h.starter.ready_later = True  # granted now, started when the test says
    for i in range(3):
        h.turn(f"t{i}")
    assert h.manager.refused["codex"].reason == "rate"
    h.clock.advance(1.0)
    for i in range(2):
        h.starter.guards[f"t{i}"].ready()
    opens = h.clock.now + 10 + START_SLACK
    why = keyctl.waits_why("codex", 1, h.manager.refused["codex"])
    assert why is not None and why["until"] == pytest.approx(opens)
    assert keyctl.keys_view(["codex"], h.manager.refused)[0]["next_grant"] == why["until"]


@scenario(caps={"codex": 1})
async def test_a_turn_past_its_timeout_is_warned_then_stopped_with_reason_timeout(h):
    with_keyctl(h, expiring_notice=5.0)
    h.turn("t1", timeout=20)
    h.clock.advance(14.9)
    assert "expiring" not in h.events("t1")
    h.clock.advance(0.1)
    assert h.events("t1")[-1] == "expiring"
    h.clock.advance(5)
    assert h.events("t1")[-1] == "stopping" and h.body("turn.t1.stopping")["reason"] == "timeout"
    assert h.guard("t1").terminated
    await h.end("t1", 143, {"code": None, "signal": 15})
    assert h.body("turn.t1.exited")["reason"] == "timeout"


@scenario(caps={"codex": 1})
async def test_session_fairness_through_the_manager(h):
    with_keyctl(h, fairness="session")
    h.turn("a1", holder={"session": "A"})
    h.turn("a2", holder={"session": "A"})
    h.turn("a3", holder={"session": "A"})
    h.turn("b1", holder={"session": "B"})
    assert [w.id for w in h.manager.queue.all()] == ["b1", "a2", "a3"]


@scenario(caps={"codex": 1})
async def test_resume_by_hand_and_a_restart_keeps_the_pause(h):
    keyctl = with_keyctl(h)
    keyctl.pause(parse_pause({"key": "codex", "for": 600}), by="control")
    h.turn("t1")
    keyctl.close()
    second = with_keyctl(h)  # the next supervisor on the same state directory
    assert second.policy.pauses.paused_until("codex", h.clock.now) == h.clock.now + 600
    assert second.resume(parse_resume({"key": "codex"}))["resumed"] == ["codex"]


@scenario(caps={"codex": 1})
async def test_a_waiting_turns_timeout_and_session_survive_a_restart(h):
    from supervisor.turns import restore

    with_keyctl(h, fairness="session")
    h.turn("busy", holder={"session": "A"})
    h.turn("a2", holder={"session": "A"}, timeout=20)
    h.turn("b1", holder={"session": "B"}, timeout=30)
    saved = h.saved()
    # busy's guard ran (its record says so: it is not held for a rerun, supervisor.turns.rerun)
    h.starter.guards["busy"].write_record()
    h.gate.held.clear()  # the old supervisor died with its locks
    h.starter.guards.clear()
    h.published.clear()
    h.clock.drop_timers()
    with_keyctl(h, fairness="session", expiring_notice=5.0)
    assert restore.restore(h.manager, saved, []) == []
    # Ranks are not saved: the rounds start again, in request order (A's turn that ran is gone).
    assert [w.id for w in h.manager.queue.all()] == ["a2", "b1"]
    h.manager.grant_waiters()
    assert h.events("a2") == ["granted", "started"]
    h.turn("a3", holder={"session": "A"})
    assert [w.id for w in h.manager.queue.all()] == ["b1", "a3"]  # and fairness goes on
    await h.end("a2")
    assert h.events("b1") == ["granted", "started"]
    h.clock.advance(25)
    assert h.events("b1")[-1] == "expiring"
    h.clock.advance(5)
    assert h.body("turn.b1.stopping")["reason"] == "timeout"


@scenario(caps={"codex": 1})
async def test_stderr_written_before_started_is_scanned_for_pause_on(h):
    """A turn's first output can come before its `started` (the guard says started once CMD runs
    and its record is written): a 429 in it pauses the key all the same, and the next waiter is
    not granted in between."""
    rule = PauseRule("codex", stderr=re.compile("429"), for_=30.0)
    keyctl = with_keyctl(h, pause_on={"codex": rule})
    h.starter.ready_later = True
    h.turn("hit")
    h.turn("next")
    assert h.events("hit") == ["queued", "granted"]
    h.manager.ledger.emit("turn.hit.stderr", {"id": "hit", "data": "HTTP 429\n", "offset": 0})
    h.guard("hit").ready()
    assert h.events("hit")[-1] == "started"
    await h.end("hit")
    for _ in range(500):  # the scanner's thread answers through the loop
        if "key.codex.paused" in h.events():
            break
        await asyncio.sleep(0.01)
    keyctl.close()  # its matcher process with it
    assert "key.codex.paused" in h.events()
    assert h.events("next") == ["queued"]
