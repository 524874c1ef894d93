"""Account pools in the turn logic, without processes: a pool's turn runs on the first member that
may take it, waits in the pool's one queue oldest first, competes with the members' direct waiters
oldest first, names its member, and gets the member's [env] (supervisor.turns.pools)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from fakes import (
    END,
    RUN,
    no_process_left,  # noqa: F401 (an autouse fixture)
    scenario,
)

from supervisor.wire.protocol import ProtocolError

POOLS = {"codex": ("codex:a", "codex:b")}
ENV = {"codex:a": {"CODEX_HOME": "/h/a"}, "codex:b": {"CODEX_HOME": "/h/b", "SECRET": "s3"}}
CAPS = {"codex:a": 1, "codex:b": 1}


def pooled(h, pools=POOLS, env=ENV):
    h.manager.settings = dataclasses.replace(h.manager.settings, pools=pools, key_env=env)
    specs = {}
    starter = h.starter

    def recording(spec):
        specs[spec.turn_id] = spec
        return type(starter).__call__(starter, spec)

    h.manager.starter.start_guard = recording
    return specs


def member(h, turn_id):
    return h.body(f"turn.{turn_id}.granted").get("member")


@scenario(caps=CAPS)
async def test_two_pool_turns_run_at_once_one_on_each_member_and_a_third_waits(h):
    specs = pooled(h)
    assert h.turn("t1", key="codex")["state"] == "running"
    h.clock.advance(1)
    assert h.turn("t2", key="codex")["state"] == "running"
    h.clock.advance(1)
    assert h.turn("t3", key="codex") == {"id": "t3", "state": "queued", "position": 1}
    assert (member(h, "t1"), member(h, "t2")) == ("codex:a", "codex:b")  # the order written
    assert h.held() == {"codex:a": ["t1"], "codex:b": ["t2"]}
    assert specs["t1"].env["CODEX_HOME"] == "/h/a" and specs["t2"].env["CODEX_HOME"] == "/h/b"
    # the member frees that the third takes: here the second one
    await h.end("t2", 0)
    assert h.events("t3") == RUN and member(h, "t3") == "codex:b"
    assert specs["t3"].env["CODEX_HOME"] == "/h/b"
    assert h.events("t2") == RUN + END
    assert [e.get("member") for e in h.saved()["running"]] == ["codex:a", "codex:b"]


@scenario(caps=CAPS)
async def test_the_member_env_comes_after_the_callers_and_is_never_written_down(h):
    specs = pooled(h)
    h.turn("t1", key="codex", env={"CODEX_HOME": "/caller", "MINE": "1"})
    assert specs["t1"].env.items() >= {"CODEX_HOME": "/h/a", "MINE": "1"}.items()
    h.turn("t2", key="codex", env={"A": "1"}, env_replace=True)
    env = specs["t2"].env
    assert (env["A"], env["CODEX_HOME"], env["SECRET"]) == ("1", "/h/b", "s3")
    ours = ("A", "CODEX_HOME", "SECRET", "OTEL_RESOURCE_ATTRIBUTES")
    assert all(v is None for k, v in env.items() if k not in ours)
    h.turn("t3", key="codex", env={"WAITING": "w"})  # waits: its own env is kept, not the member's
    files = [p.read_text() for p in h.paths.root.rglob("*") if p.is_file()]
    written = json.dumps(h.published) + "".join(files)
    assert any("WAITING" in text for text in files)  # (the files were read)
    assert "/h/a" not in written and "s3" not in written and "/h/b" not in written
    assert h.manager.turns["t1"].env == {}  # given to the guard, not kept


@scenario(caps=CAPS)
async def test_a_member_without_quota_room_or_paused_sends_every_turn_to_the_other(h):
    pooled(h)
    h.manager.quota_room = lambda key, now: key != "codex:a"
    h.turn("t1", key="codex")
    assert member(h, "t1") == "codex:b"
    h.clock.advance(1)
    assert h.turn("t2", key="codex")["state"] == "queued"  # b is full, a has no room
    why = h.manager.refused["codex"]
    assert why.reason == "key_full"  # b frees first, or a's window resets
    assert why.detail == "no member of the pool can take it (codex:a: quota, codex:b: key_full)"
    await h.end("t1", 0)
    assert member(h, "t2") == "codex:b"
    h.manager.quota_room = lambda key, now: True
    h.clock.advance(1)
    h.turn("t3", key="codex")
    assert member(h, "t3") == "codex:a"


@scenario(caps=CAPS)
async def test_a_member_asked_directly_counts_against_the_pool(h):
    pooled(h)
    h.turn("d1", key="codex:a")
    h.clock.advance(1)
    h.turn("t1", key="codex")
    assert member(h, "t1") == "codex:b"
    h.clock.advance(1)
    assert h.turn("t2", key="codex")["state"] == "queued"
    assert h.held() == {"codex:a": ["d1"], "codex:b": ["t1"]}
    await h.end("d1", 0)
    assert member(h, "t2") == "codex:a"


@scenario(caps=CAPS)
async def test_a_direct_waiter_and_the_pools_waiter_are_granted_oldest_first_across_both(h):
    pooled(h)
    h.turn("d0", key="codex:a")
    h.turn("p0", key="codex")  # on b
    h.clock.advance(1)
    h.turn("p1", key="codex")  # waits: older than d2
    h.clock.advance(1)
    h.turn("d2", key="codex:a")  # waits for a, behind p1
    h.clock.advance(1)
    h.turn("d3", key="codex:a")
    await h.end("d0", 0)  # a frees: p1 is the oldest that can take it
    assert member(h, "p1") == "codex:a"
    assert h.events("d2") == ["queued"]
    await h.end("p1", 0)
    assert h.events("d2") == RUN  # then the direct ones, in their order
    assert h.events("d3") == ["queued"]
    h.clock.advance(1)
    h.turn("p4", key="codex")  # newer than d3: waits behind it for a, or takes b
    await h.end("d2", 0)
    assert h.events("d3") == RUN and h.events("p4") == ["queued"]
    await h.end("p0", 0)
    assert member(h, "p4") == "codex:b"


@scenario(caps=CAPS)
async def test_a_pool_keeps_fifo_over_many_turns_and_never_exceeds_a_members_cap(h):
    pooled(h)
    for i in range(60):
        h.turn(f"t{i:02d}", key="codex")
        h.clock.advance(0.01)
    order = []
    while len(order) < 60:
        running = [t for t in h.manager.turns.values() if t.state.value == "running"]
        assert len(running) <= 2
        assert len({t.member for t in running}) == len(running)  # one per member
        order += sorted(t.id for t in running if t.id not in order)
        await h.end(min(running, key=lambda t: t.id).id, 0)
    assert order == [f"t{i:02d}" for i in range(60)]


@scenario(caps=CAPS)
async def test_a_reservation_for_a_pool_is_refused_naming_the_key(h):
    pooled(h)
    with pytest.raises(ProtocolError) as info:
        h.reserve("r1", key="codex")
    assert info.value.code == "bad_request"
    assert "'key' 'codex' is a pool ([pools])" in info.value.message
    assert "codex:a, codex:b" in info.value.message
    assert h.events() == []


@scenario(caps=CAPS)
async def test_a_waiting_pool_turn_comes_back_in_its_place_after_a_restart(h):
    pooled(h)
    h.turn("t1", key="codex")
    h.turn("t2", key="codex")
    h.clock.advance(1)
    h.turn("t3", key="codex")
    h.clock.advance(1)
    h.turn("t4", key="codex")
    saved = h.saved()
    assert [(w["id"], w["key"]) for w in saved["waiting"]] == [("t3", "codex"), ("t4", "codex")]
    assert {e["id"]: e["member"] for e in saved["running"]} == {"t1": "codex:a", "t2": "codex:b"}
    # the same supervisor after a restart: t1 and t2 are lost (their guards are fakes, which
    # ran: their records say so, so they are not held for a rerun), the waiters take their
    # slots in their order
    for ran in ("t1", "t2"):
        h.starter.guards[ran].write_record()
    h.gate.held.clear()
    h.manager = h.new_manager()
    pooled(h)
    from supervisor.turns import restore

    restore.restore(h.manager, h.saved(), h.gate.inspect_all())
    assert [w.id for w in h.manager.queue.all()] == ["t3", "t4"]
    h.manager.grant_waiters()
    assert (member(h, "t3"), member(h, "t4")) == ("codex:a", "codex:b")


@scenario(caps={"codex:a": 2, "codex:b": 1})
async def test_two_slots_freed_at_once_go_to_the_two_oldest_across_the_member_and_the_pool(h):
    pooled(h)
    outside = [h.gate.try_acquire("codex:a", None) for _ in range(2)]  # another program's
    h.turn("y", key="codex:b")
    h.turn("d1", key="codex:a")
    h.clock.advance(1)
    h.turn("p2", key="codex")
    h.clock.advance(1)
    h.turn("d3", key="codex:a")
    for slot in outside:
        slot.release()
    h.manager.retry_grants()  # (what the periodic retry does)
    assert h.events("d1") == RUN and h.events("p2") == RUN and member(h, "p2") == "codex:a"
    assert h.events("d3") == ["queued"]
