"""Restore after a restart, without processes: saved events replayed through the same tables."""

from __future__ import annotations

import asyncio
import errno

import pytest
from fakes import (
    END,
    RUN,
    FakeSlot,
    Harness,
    no_process_left,  # noqa: F401 (an autouse fixture)
    scenario,
)

from supervisor.turns import restore, store

# -- restore after a restart -----------------------------------------------------------------------


@scenario(caps={"codex": 1, "claude": 1})
async def test_restore_brings_waiters_back_in_order_without_announcing_them_again(h):
    h.turn("busy")
    for name in ["w0", "w1"]:
        h.clock.advance(1)
        h.turn(name, env={"TOKEN": "x"})
    h.clock.advance(1)
    h.reserve("rq")
    saved = h.saved()
    # busy's guard ran (its record says so: it is not held for a rerun, supervisor.turns.rerun)
    h.starter.guards["busy"].write_record()
    h.gate.held.clear()  # the old supervisor died with its locks
    h.starter.guards.clear()
    m = h.new_manager()
    problems = restore.restore(m, saved, [])
    assert problems == []
    assert [w.id for w in m.queue.all()] == ["w0", "w1", "rq"]
    assert h.events() == [
        "turn.busy.exited",
        "turn.busy.gone",
        "turn.busy.released",
    ]  # only the lost turn's end is news
    assert h.body("turn.busy.exited")["reason"] == "supervisor_restarted"
    m.grant_waiters()
    assert h.events("w0") == ["granted", "started"]
    assert h.held() == {"codex": ["w0"]}


@scenario()
async def test_a_lost_turn_whose_slot_still_shows_work_waits_for_settle_lost(h):
    h.turn("busy")
    saved = h.saved()
    m = h.new_manager()
    restore.restore(m, saved, h.gate.inspect_all())  # the old work still holds the slot
    assert h.events() == [] and m.ledger.lost_running == [{"id": "busy", "key": "codex"}]
    assert [(e["id"], e["key"]) for e in h.saved()["running"]] == [("busy", "codex")]
    h.gate.held.clear()  # reaped
    restore.settle_lost(m, h.gate.inspect_all())
    assert h.events("busy") == END
    assert m.ledger.lost_running == [] and h.saved()["running"] == []


@scenario()
async def test_restore_cancels_waiters_whose_requester_died_and_keeps_the_others(h):
    h.requesters.alive.update({11, 12})
    h.turn("busy")
    h.turn("orphan", holder={"pid": 11, "start": 5})
    h.turn("kept", holder={"pid": 12, "start": 5})
    saved = h.saved()
    m = h.new_manager()
    h.alive.discard(11)
    restore.restore(m, saved, h.gate.inspect_all())
    assert h.events("orphan") == ["cancelled"]
    assert h.body("turn.orphan.cancelled")["reason"] == "requester_gone"
    assert [w.id for w in m.queue.all()] == ["kept"]
    assert m.requesters.watched == {12: {"kept"}}


@scenario(ttl=30.0)
async def test_restore_retakes_a_held_reservation_with_its_end_capped(h):
    h.reserve("r1")
    saved = h.saved()
    saved["reservations"][0]["until"] = h.clock.now + 10**6
    h.gate.held.clear()
    m = h.new_manager()
    restore.restore(m, saved, [])
    assert h.events() == []
    assert h.held() == {"codex": ["r1"]}
    assert h.reserve("r1")["until"] == h.clock.now + 30
    h.clock.advance(30)
    assert h.events("r1") == ["released"]
    assert h.body("turn.r1.released")["reason"] == "expired"


@pytest.mark.parametrize(
    "case, reason",
    [("expired", "expired"), ("taken", "lost"), ("requester", "requester_gone")],
)
def test_restore_releases_a_held_reservation_it_cannot_keep(tmp_path, case, reason):
    async def body(h):
        h.requesters.alive.add(31)
        h.reserve("r1", holder={"session": "s", "pid": 31, "start": 2})
        saved = h.saved()
        h.gate.held.clear()
        if case == "expired":
            h.clock.advance(61)
        elif case == "taken":
            h.gate.held[("codex", 0)] = FakeSlot(h.gate, "codex", 0, None, None)
        if case == "requester":
            h.alive.clear()
        m = h.new_manager()
        restore.restore(m, saved, [])
        assert h.events("r1") == ["released"]
        assert h.body("turn.r1.released") == {
            "id": "r1",
            "key": "codex",
            "reservation": True,
            "reason": reason,
            "index": None,
        }
        assert m.reservations == {}

    asyncio.run(body(Harness(tmp_path)))


@scenario()
async def test_restore_requeues_a_waiting_reservation_and_remembers_finished_ids(h):
    h.turn("done")
    await h.end("done")
    h.turn("busy")
    h.reserve("r1")
    saved = h.saved()
    saved["running"].append({"id": "done", "key": "codex"})  # a crash between append and save
    m = h.new_manager()
    restore.restore(m, saved, h.gate.inspect_all())
    assert h.events() == []
    assert [w.id for w in m.queue.all()] == ["r1"]
    assert h.turn("done") == {"id": "done", "state": "released", "position": None}


@scenario()
async def test_restore_keeps_a_waiters_deadline_and_cancels_it_when_passed(h):
    h.turn("busy")
    h.turn("soon", wait_timeout=10)
    h.turn("later", wait_timeout=100)
    saved = h.saved()
    assert {w["id"]: w["wait_deadline"] for w in saved["waiting"]} == {
        "soon": h.clock.now + 10,
        "later": h.clock.now + 100,
    }
    h.clock.advance(20)  # the supervisor was down for 20 s
    m = h.new_manager()
    restore.restore(m, saved, h.gate.inspect_all())
    h.clock.advance(0)
    assert h.events("soon") == ["cancelled"]
    assert h.body("turn.soon.cancelled")["reason"] == "timeout"
    assert [w.id for w in m.queue.all()] == ["later"]
    h.clock.advance(80)
    assert h.events("later") == ["cancelled"]


@scenario()
async def test_restore_names_each_malformed_entry_and_keeps_the_rest(h):
    h.turn("busy")
    h.turn("good")
    saved = h.saved()
    saved["waiting"].insert(0, {"id": "bad", "key": "codex", "argv": "not a list"})
    saved["reservations"].append({"id": "r"})
    saved["running"].append("garbage")
    m = h.new_manager()
    problems = restore.restore(m, saved, h.gate.inspect_all())
    assert len(problems) == 3
    assert problems[0].startswith("running entry garbage is malformed")
    assert problems[1].startswith("reservation entry {'id': 'r'} is malformed")
    assert problems[2].startswith("waiting entry bad is malformed")
    assert [w.id for w in m.queue.all()] == ["good"]


# -- a full disk --------------------------------------------------------------------


class _NoSpace:
    """Makes supervisor.turns.store's appends to `name` fail with ENOSPC while in the block."""

    def __init__(self, target, attribute: str):
        self.target, self.attribute = target, attribute

    def __enter__(self):
        self.real = getattr(self.target, self.attribute)

        def no_space(*args, **kwargs):
            raise OSError(errno.ENOSPC, "No space left on device", "finished.log")

        setattr(self.target, self.attribute, no_space)

    def __exit__(self, *exc):
        setattr(self.target, self.attribute, self.real)


@scenario()
async def test_an_end_that_finished_log_cannot_take_keeps_the_turn_on_file_so_no_restart_runs_it(h):
    h.turn("busy")
    h.turn("t2")
    with _NoSpace(store, "append_finished"):
        h.manager.cancel("t2")
        assert h.events("t2") == ["queued", "cancelled"]
        saved = h.saved()
        assert saved["waiting"] == [] and {"id": "t2", "key": "codex"} in saved["running"]
        h.manager.ledger.save_again()  # still full: nothing changes
        assert ("t2", "codex") in [(e["id"], e["key"]) for e in h.saved()["running"]]
    # A crash now: the restarted supervisor ends t2's story; it never runs.
    h.gate.held.clear()
    h.starter.guards.clear()
    m = h.new_manager()
    restore.restore(m, saved, [])
    m.grant_waiters()
    assert "started" not in h.events("t2") and "t2" in m.finished


@scenario()
async def test_an_end_saved_again_once_finished_log_takes_it_leaves_queue_json(h):
    h.turn("busy")
    h.turn("t2")
    with _NoSpace(store, "append_finished"):
        h.manager.cancel("t2")
    assert ("t2", "codex") in [(e["id"], e["key"]) for e in h.saved()["running"]]
    h.manager.ledger.save_again()  # room again: the periodic duty appends it, then it leaves
    assert store.load_finished(h.paths.finished)[0]["t2"][0] == "cancelled"
    assert [(e["id"], e["key"]) for e in h.saved()["running"]] == [("busy", "codex")]


@scenario()
async def test_a_grant_that_cannot_be_saved_is_not_started_until_it_is_and_a_stop_ends_it(h):
    h.turn("t1")
    h.turn("t2")
    queue_file = h.manager.ledger.queue_file
    with _NoSpace(queue_file, "update"):
        await h.end("t1", 0)
        assert h.events("t2") == ["queued", "granted"]  # held, not started: not on file yet
        h.manager.tick()
        assert h.events("t2") == ["queued", "granted"]
        assert [w["id"] for w in h.saved()["waiting"]] == ["t2"]
    h.manager.tick()  # saved now: started
    assert h.events("t2") == RUN
    assert [(e["id"], e["key"]) for e in h.saved()["running"]] == [("t2", "codex")]
    h.turn("t3")
    with _NoSpace(queue_file, "update"):
        await h.end("t2", 0)
        assert h.events("t3") == ["queued", "granted"]
        h.manager.begin_stop()  # a stop ends the unstarted grant: nothing waits for a guard
        assert h.events("t3") == ["queued", "granted", *END]
        assert h.body("turn.t3.exited")["reason"] == "shutdown before its grant could be saved"
        assert h.held() == {}
        assert h.manager.ledger.idle.is_set()


@scenario(caps={"codex": 1})
async def test_a_restored_waiter_keeps_its_whole_environment_and_stdin_mode(h):
    h.turn("busy")
    h.clock.advance(1)
    h.turn("w", env={"PATH": "/mine"}, env_replace=True, stdin="tty", winsize=[40, 100])
    saved = h.saved()
    h.gate.held.clear()  # the old supervisor died with its locks
    h.starter.guards.clear()
    m = h.new_manager()
    assert restore.restore(m, saved, []) == []
    (waiter,) = [t for t in m.turns.values() if t.id == "w"]
    assert (waiter.env, waiter.env_replace, waiter.stdin, waiter.winsize) == (
        {"PATH": "/mine"},
        True,
        "tty",
        (40, 100),
    )


# A waiting turn and a running one as the release before adoption wrote them (commit 7b3474a's
# Turn.to_json: no env_replace, stdin, winsize; a running entry with only its id and key).
OLD_WAITING = ("id", "key", "argv", "cwd", "env", "holder", "requested_at", "wait_deadline")
OLD_WAITING_ALSO = ("reservation", "timeout")


@scenario(caps={"codex": 1})
async def test_restore_takes_back_the_entries_of_the_release_before(h):
    h.turn("busy")
    h.clock.advance(1)
    h.turn("w0", env={"TOKEN": "x"})
    saved = h.saved()
    saved["waiting"] = [
        {k: v for k, v in e.items() if k in OLD_WAITING + OLD_WAITING_ALSO}
        for e in saved["waiting"]
    ]
    saved["running"] = [{"id": e["id"], "key": e["key"]} for e in saved["running"]]
    h.gate.held.clear()  # the old supervisor died with its locks, its work with it
    h.starter.guards.clear()
    m = h.new_manager()
    assert restore.restore(m, saved, []) == []
    assert [w.id for w in m.queue.all()] == ["w0"]
    assert h.body("turn.busy.exited")["reason"] == "supervisor_restarted"
    m.grant_waiters()
    assert h.events("w0") == ["granted", "started"]
