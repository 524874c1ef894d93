"""A guard's hints and its end, without processes: what is published, in what order, and when
the slot is released."""

from __future__ import annotations

import pytest
from fakes import (
    END,
    NO_USAGE,
    RUN,
    no_process_left,  # noqa: F401 (an autouse fixture)
    scenario,
)

# -- the guard's hints and its end -----------------------------------------------------------------


@scenario()
async def test_a_gone_hint_whose_groups_still_run_changes_nothing(h):
    h.turn("t1")
    h.guard("t1").write_record(state="gone", exit={"code": 0, "signal": None})
    h.probe.alive.add(h.guard("t1").identity.pid + 1)  # its own group still runs
    h.manager.on_guard_hint("guard.t1.gone", {})
    await h.settle()
    assert h.events("t1") == RUN
    assert h.held() == {"codex": ["t1"]}


@scenario()
async def test_a_gone_hint_that_holds_releases_before_the_guard_is_reaped(h):
    files = h.manager.ledger.files
    removals: list[str] = []
    real_unlink_soon = files.unlink_soon
    files.unlink_soon = lambda path: removals.append(str(path)) or real_unlink_soon(path)
    h.turn("t1")
    h.guard("t1").write_record(state="gone", exit={"code": 0, "signal": None})
    h.manager.on_guard_hint("guard.t1.gone", {})
    await h.settle()
    assert h.events("t1") == RUN + END
    assert h.held() == {}
    assert h.manager.ledger.files.drain()
    # "gone" is the guard's last write: dropped at the release, though the guard is still on its
    # way out (a stop can end before it is reaped, and its record would stay behind)
    assert not h.guard("t1").record_path.exists()
    h.guard("t1").end(0, state=None)
    await h.settle()
    assert h.events("t1") == RUN + END
    assert not h.guard("t1").record_path.exists()
    assert removals == [str(h.guard("t1").record_path)]  # once, by the first of its three ends


@scenario()
async def test_an_exited_hint_publishes_the_outcome_once(h):
    h.turn("t1")
    h.guard("t1").write_record(state="stopping", exit={"code": 4, "signal": None})
    h.manager.on_guard_hint("guard.t1.exited", {})
    h.manager.on_guard_hint("guard.t1.exited", {})
    assert h.events("t1") == RUN + ["exited"]
    assert h.held() == {"codex": ["t1"]}  # capacity is not back on exited
    await h.end("t1", 4)
    assert h.events("t1") == RUN + END


@scenario()
async def test_each_new_group_is_published_once_and_recorded_in_the_slot(h):
    h.turn("t1")
    guard = h.guard("t1")
    guard.write_record(groups=[500])
    h.manager.on_guard_hint("guard.t1.group", {})
    h.manager.on_guard_hint("guard.t1.group", {})  # hints are taken in batches (one read)
    await h.settle()
    guard.write_record(groups=[500, 501])
    h.manager.on_guard_hint("guard.t1.group", {})
    await h.settle()
    own = guard.identity.pid + 1
    assert [(t, b.get("pgid")) for t, b in h.published if t == "turn.t1.group"] == [
        ("turn.t1.group", own),
        ("turn.t1.group", 500),
        ("turn.t1.group", 501),
    ]
    assert [g.pgid for g in h.gate.held[("codex", 0)].work["groups"]] == [own, 500, 501]


@scenario()
async def test_a_guard_lost_outright_has_its_work_ended_here_then_releases(h):
    h.turn("t1")
    guard = h.guard("t1")
    guard.write_record(state="running", groups=[600])
    h.probe.alive.add(600)
    guard.end(125, exit=None, state=None)  # killed: the record still says running
    await h.settle()
    assert h.probe.ended == ["t1"]
    assert h.events("t1") == RUN + END
    assert h.body("turn.t1.exited") == {
        "id": "t1",
        "key": "codex",
        "code": None,
        "signal": None,
        "reason": "guard_lost",
        **NO_USAGE,
    }
    assert h.held() == {}


@scenario()
async def test_work_that_cannot_be_ended_keeps_the_slot_until_a_later_tick_ends_it(h):
    h.turn("t1")
    h.turn("t2")
    h.guard("t1").write_record(groups=[600])
    h.probe.alive.add(600)
    h.probe.can_end = False
    h.guard("t1").end(125, exit=None, state=None)
    await h.settle()
    assert h.events("t1") == RUN + ["exited"]
    assert h.held() == {"codex": ["t1"]} and h.events("t2") == ["queued"]
    h.probe.can_end = True
    h.manager.tick()
    await h.settle()
    assert h.events("t1") == RUN + END
    assert h.events("t2") == RUN


@scenario()
async def test_escapees_of_a_guard_that_did_not_end_its_work_are_ended_too(h):
    h.turn("t1")
    h.probe.escaped.add("t1")
    await h.end("t1", 0, state="stopping")
    assert h.probe.ended == ["t1"]
    assert h.events("t1") == RUN + END


@scenario()
async def test_a_guard_that_ended_its_own_work_is_not_swept_for_escapees(h):
    h.turn("t1")
    h.probe.escaped.add("t1")  # its "gone" covers them: no sweep of every environment
    await h.end("t1", 0, state="gone")
    assert h.probe.ended == []
    assert h.events("t1") == RUN + END


@scenario(caps={"codex": 2})
async def test_a_turn_that_raises_in_tick_keeps_no_other_turn_from_being_looked_at(h):
    h.turn("t1")
    h.turn("t2")
    looked: list[str] = []

    def broken() -> None:
        looked.append("t1")
        raise RuntimeError("t1's guard is broken")

    h.guard("t1").terminate_if_pending = broken
    h.guard("t2").terminate_if_pending = lambda: looked.append("t2")
    with pytest.raises(RuntimeError, match="t1's guard is broken"):  # the daemon counts it
        h.manager.endings.tick()
    assert sorted(looked) == ["t1", "t2"]
