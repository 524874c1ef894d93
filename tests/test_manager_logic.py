"""The manager's logic without processes, honcho's way: scripted histories against fakes.

Each test drives the Manager (and restore) through a history — requests, grants, a guard's hints
and its end, cancels, clock jumps, a restart — with an injected clock and timers, a fake slot gate,
a fake guard starter, a fake requester watcher and a fake probe of /proc, and asserts exactly the
events published and the slots held. No process, lock or socket is used; the whole file runs in
well under a second. (The real-process tests, test_daemon, test_restart, test_reservations, are
what prove containment and the daemon's wiring.)
"""

from __future__ import annotations

import asyncio
import errno
import heapq
import itertools
import json
import os
import shutil
from pathlib import Path

import psutil
import pytest

from guardd.procs import Group, Identity
from supervisor import restore, store
from supervisor.command_args import parse_reserve, parse_turn
from supervisor.endings import ACTIONS, Action, Phase, What
from supervisor.holder import Holder
from supervisor.manager import Manager, Settings
from supervisor.paths import StatePaths
from supervisor.protocol import ProtocolError
from supervisor.slots import SlotView
from supervisor.spawn import LOG_FILES
from supervisor.turns import IllegalTransition


@pytest.fixture(autouse=True)
def no_process_left():
    """These histories start no process at all: instead of conftest's sweep of every process's
    environment (most of this file's time on a loaded machine), check that none was started."""
    yield
    assert psutil.Process().children(recursive=True) == []


DEAD_PID = 4_000_000  # above any pid_max here: never a running process
HOLDER = {"session": "s1", "agent": "a1"}

# -- the fakes -------------------------------------------------------------------------------------


class Clock:
    """Time that moves only when the test says; timers fire in order as it passes them."""

    def __init__(self, now: float = 1_000_000.0):
        self.now = now
        self._timers: list = []
        self._seq = itertools.count()

    def __call__(self) -> float:
        return self.now

    def call_later(self, delay, callback):
        handle = _Handle()
        heapq.heappush(self._timers, (self.now + delay, next(self._seq), callback, handle))
        return handle

    def drop_timers(self) -> None:
        self._timers.clear()

    def advance(self, seconds: float) -> None:
        self.now += seconds
        while self._timers and self._timers[0][0] <= self.now:
            _, _, callback, handle = heapq.heappop(self._timers)
            if not handle.cancelled:
                callback()


class _Handle:
    cancelled = False

    def cancel(self):
        self.cancelled = True


class FakeSlot:
    def __init__(self, gate, key, index, turn, reservation):
        self.gate, self.key, self.index = gate, key, index
        self.turn, self.reservation = turn, reservation
        self.took_over = None
        self.work = None

    def bind(self, *, turn, reservation):
        self.turn, self.reservation = turn, reservation

    def record_work(self, guard, record_path, groups):
        if self.gate.record_work_error is not None:
            raise self.gate.record_work_error
        self.work = {"guard": guard, "groups": list(groups)}

    def release(self):
        self.gate.held.pop((self.key, self.index), None)


class FakeGate:
    """Caps by key; a slot is held until released. `outside` slots are held by someone else."""

    def __init__(self, caps):
        self.caps = caps
        self.held: dict[tuple[str, int], FakeSlot] = {}
        self.record_work_error: Exception | None = None
        self.holders: list[Holder] = []

    def try_acquire(self, key, holder, *, turn=None, reservation=None):
        for index in range(self.caps.get(key, 1)):
            if (key, index) not in self.held:
                self.holders.append(holder)
                slot = FakeSlot(self, key, index, turn, reservation)
                self.held[(key, index)] = slot
                return slot
        return None

    def inspect_all(self):
        return [
            SlotView(key, index, self.caps.get(key, 1), "held", turn=slot.turn)
            for (key, index), slot in sorted(self.held.items())
        ]

    def holding(self) -> dict[str, list[str]]:
        """key -> what holds its slots: turn ids, reservation ids, or 'outside'."""
        out: dict[str, list[str]] = {}
        for (key, _), slot in sorted(self.held.items()):
            name = slot.turn or (slot.reservation or {}).get("id") or "outside"
            out.setdefault(key, []).append(name)
        return out


class FakeGuard:
    """A guard that runs nothing: the test writes its record and says when it ends."""

    _pids = itertools.count(DEAD_PID)

    def __init__(self, turn_id, record_dir: Path, attach_error=None):
        self.turn_id = turn_id
        self.identity = Identity(next(self._pids), 7)
        self.record_path = record_dir / f"{self.identity.pid}-7.json"
        self.returncode = None
        self.status = None
        self.terminated = 0
        self.attach_error = attach_error
        self.on_exit = None
        self.stdin = b""

    def attach(self, loop, log_dir, on_output, on_exit):
        assert log_dir.is_dir()
        if self.attach_error is not None:
            raise self.attach_error
        self.on_output, self.on_exit = on_output, on_exit

    def terminate(self):
        self.terminated += 1
        return True

    def terminate_if_pending(self):
        pass

    def reap(self):
        if self.returncode is None:
            self.returncode = self.status
        return self.returncode

    def close(self):
        pass

    def drain(self):
        pass

    def write_stdin(self, data, eof=False):
        self.stdin += data
        self.stdin_eof = eof
        return len(data)

    stdin_pending = 0  # the pipe takes everything at once (world.Guard)

    # what the test scripts
    def write_record(self, state="running", exit=None, groups=()):
        record = {
            "v": 1,
            "guard": self.identity.to_json(),
            "turn": self.turn_id,
            "own_group": {"pgid": self.identity.pid + 1, "leader_start": 8},
            "groups": [{"pgid": g, "leader_start": 9, "seen_at": 0} for g in groups],
            "state": state,
            "exit": exit,
        }
        self.record_path.write_text(json.dumps(record))

    def end(self, status, exit=None, state="gone"):
        """The guard process ends with `status`, its record saying `state` and `exit`."""
        if exit is not None or state is not None:
            self.write_record(state=state, exit=exit)
        self.status = status
        if self.on_exit is not None:
            self.on_exit()


class FakePending:
    """A guard asked of the zygote whose answer the test gives (world.PendingStart)."""

    def __init__(self, guard):
        self.guard, self.callback = guard, None

    def then(self, callback):
        self.callback = callback

    def settle(self):
        self.callback(self.guard)


class Starter:
    def __init__(self, record_dir: Path):
        self.record_dir = record_dir
        self.guards: dict[str, FakeGuard] = {}
        self.hold = False  # True: answer with a FakePending, settled by the test
        self.pending: dict[str, FakePending] = {}
        self.error: OSError | None = None
        self.attach_error: OSError | None = None
        self.during = None  # called while the guard starts

    def __call__(self, turn_id, argv, *, cwd, env, record_dir, grace, scan, bus):
        if self.error is not None:
            raise self.error
        if self.during is not None:
            self.during()
        guard = FakeGuard(turn_id, record_dir, self.attach_error)
        self.guards[turn_id] = guard
        if self.hold:
            self.pending[turn_id] = FakePending(guard)
            return self.pending[turn_id]
        return guard


# What a turn used, as `exited` carries it: the fake guard records none, and the clock stands still.
NO_USAGE = {
    "wall_s": 0.0,
    "wait_s": 0.0,
    "cpu_user_s": None,
    "cpu_system_s": None,
    "peak_rss_bytes": None,
    "processes": None,
}


class FakeProbe:
    """/proc as the test says: which pgids live, which turns have escapees, whether ending works."""

    def __init__(self):
        self.alive: set[int] = set()
        self.escaped: set[str] = set()
        self.can_end = True
        self.ended: list[str] = []

    def memberless(self, groups):
        return not self.groups_alive(groups)

    def groups_alive(self, groups):
        return any(g.pgid in self.alive for g in groups)

    def escapees(self, turn_id):
        return turn_id in self.escaped

    def end_work(self, groups, turn_id, grace):
        self.ended.append(turn_id)
        if self.can_end:
            self.alive -= {g.pgid for g in groups}
            self.escaped.discard(turn_id)
        return self.can_end


class FakeRequesters:
    """Requesters by pid: alive until the test kills them."""

    def __init__(self, on_gone):
        self.on_gone = on_gone
        self.alive: set[int] = set()
        self.watched: dict[int, set[str]] = {}

    def identify(self, holder):
        if holder.pid is None:
            return None
        if holder.pid not in self.alive:
            raise ProtocolError("bad_request", f"the requester (pid {holder.pid}) is not running")
        return Identity(holder.pid, holder.start or 1)

    def restored(self, holder):
        if holder.pid is None:
            return None
        return Identity(holder.pid, holder.start or 1) if holder.pid in self.alive else False

    def watch(self, ident, item_id):
        if ident.pid not in self.alive:
            return False
        self.watched.setdefault(ident.pid, set()).add(item_id)
        return True

    def unwatch(self, ident, item_id):
        if ident is not None:
            self.watched.get(ident.pid, set()).discard(item_id)

    def close(self):
        self.watched.clear()

    def die(self, pid):
        self.alive.discard(pid)
        for item_id in sorted(self.watched.pop(pid, set())):
            self.on_gone(item_id)


# -- the harness -----------------------------------------------------------------------------------


class Harness:
    def __init__(self, root: Path, caps=None, ttl=60.0):
        self.paths = StatePaths(root)
        self.paths.ensure()
        self.clock = Clock()
        self.gate = FakeGate(caps or {"codex": 1})
        self.starter = Starter(self.paths.guards)
        self.probe = FakeProbe()
        self.published: list[tuple[str, dict]] = []
        self.ttl = ttl
        self.alive: set[int] = set()  # requester pids that run
        self.manager = self.new_manager()

    def new_manager(self) -> Manager:
        """A manager on this state directory (a second one is the supervisor after a restart)."""
        self.published.clear()
        self.clock.drop_timers()  # the old supervisor's timers died with it
        manager = Manager(
            paths=self.paths,
            gate=self.gate,
            publish=lambda topic, body: self.published.append((topic, body)),
            settings=Settings(0.1, 0.1, None, "test", reservation_ttl=self.ttl),
            clock=self.clock,
            start_guard=self.starter,
            timers=self.clock,
            requesters=FakeRequesters,
            probe=self.probe,
            me=Identity(os.getpid(), 1),
        )
        self.requesters: FakeRequesters = manager.requesters
        self.requesters.alive = self.alive  # processes outlive a supervisor
        return manager

    def turn(self, turn_id, key="codex", **fields):
        return self.manager.request_turn(
            parse_turn({"id": turn_id, "key": key, "argv": ["x"], **fields})
        )

    def reserve(self, res_id, key="codex", holder=HOLDER, **fields):
        return self.manager.reserve(
            parse_reserve({"id": res_id, "key": key, "holder": holder, **fields})
        )

    def guard(self, turn_id) -> FakeGuard:
        return self.starter.guards[turn_id]

    def events(self, item_id=None) -> list[str]:
        """The topics published (for one id: just the event names), in order."""
        if item_id is None:
            return [t for t, _ in self.published]
        prefix = f"turn.{item_id}."
        return [t[len(prefix) :] for t, _ in self.published if t.startswith(prefix)]

    def body(self, topic) -> dict:
        (found,) = [b for t, b in self.published if t == topic]
        return found

    def held(self):
        return self.gate.holding()

    def saved(self) -> dict:
        """queue.json as the next supervisor loads it (supervisor.store)."""
        data, problem = store.load(self.paths.queue)
        assert problem is None
        return data

    async def settle(self):
        """Let the confirmations the manager started (tasks, threads) finish."""
        for _ in range(50):
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            if not tasks:
                assert self.manager.ledger.files.drain()  # removals are done off the loop
                return
            await asyncio.wait(tasks, timeout=2)
        raise AssertionError("tasks did not settle")

    async def end(self, turn_id, status=0, exit=None, state="gone"):
        self.guard(turn_id).end(status, exit if exit is not None else _exit(status), state)
        await self.settle()


def _exit(status):
    return {"code": status, "signal": None} if status != 125 else None


def scenario(**options):
    """Run an async test body with a fresh harness (options: caps, ttl) on its own event loop."""

    def wrap(body):
        def test(tmp_path):
            async def main():
                await body(Harness(tmp_path, **options))

            asyncio.run(main())

        test.__name__, test.__doc__ = body.__name__, body.__doc__
        return test

    return wrap


RUN = ["queued", "granted", "started"]
END = ["exited", "gone", "released"]

# -- request and grant -----------------------------------------------------------------------------


@scenario()
async def test_a_request_with_a_free_slot_is_granted_and_started(h):
    assert h.turn("t1") == {"id": "t1", "state": "running", "position": None}
    assert h.events("t1") == RUN
    assert h.held() == {"codex": ["t1"]}
    assert h.saved()["running"] == [{"id": "t1", "key": "codex"}]
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
    assert h.manager.cancel("t1") == {"id": "t1", "state": "released"}
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
    assert h.saved()["running"] == [{"id": "busy", "key": "codex"}]
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
    assert problems[0] == "running entry garbage is malformed"
    assert problems[1].startswith("reservation entry {'id': 'r'} is malformed")
    assert problems[2].startswith("waiting entry bad is malformed")
    assert [w.id for w in m.queue.all()] == ["good"]


# -- the table itself ------------------------------------------------------------------------------


def test_every_phase_says_what_a_cancel_does_and_an_illegal_pair_raises(tmp_path):
    assert {phase for phase, what in ACTIONS if what is What.CANCEL} == set(Phase)
    assert {phase for phase, what in ACTIONS if what is What.GUARD_ENDED} == set(Phase) - {
        Phase.WAITING,
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
    from supervisor.admission import Refusal

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
    from supervisor.command_args import parse_send

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
    from supervisor.command_args import parse_send

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


def test_the_holder_type_round_trips_as_a_slot_record_and_a_request_gives_it():
    from supervisor.command_args import parse_holder

    holder = parse_holder({"session": "s", "pid": 5})
    assert holder == Holder(pid=5, session="s")
    held = holder.held_by(9, 10)
    assert Holder.from_json(held.to_json()) == held == Holder(9, 10, session="s")
    assert Group(1, None) == Group(1, None)  # groups are values (the fakes compare them)
