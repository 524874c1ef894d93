"""The turn logic's fakes, honcho's way: an injected clock and timers, a fake slot gate, a fake
guard starter, a fake requester watcher and a fake probe of /proc, and the Harness that drives the
Manager (and restore) through scripted histories with them. No process, lock or socket is used.

Used by tests/turns/ (the manager's logic, section by section) and tests/admission/ (admission
through the manager).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import os
from pathlib import Path

import psutil
import pytest

from guardd.procs import Identity
from supervisor.guards.handle import GuardSpec
from supervisor.holder import Holder
from supervisor.paths import StatePaths
from supervisor.slots.gate import SlotView
from supervisor.turns import store
from supervisor.turns.manager import Manager, Settings
from supervisor.wire.args import parse_reserve, parse_turn
from supervisor.wire.protocol import ProtocolError


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

    def record_work(self, guard, record_path, groups, cgroup=None, *, command=None):
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
        self.failing: dict[str, Exception] = {}  # key -> what try_acquire raises for it

    def try_acquire(self, key, holder, *, turn=None, reservation=None):
        if key in self.failing:
            raise self.failing[key]
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

    def survey(self):
        taken = self.inspect_all()
        keys = sorted(set(self.caps) | {view.key for view in taken})
        tallies = []
        for key in keys:
            cap = self.caps.get(key, 1)
            held = sum(1 for view in taken if view.key == key)
            tallies.append(
                {"key": key, "cap": cap, "free": max(0, cap - held), "reserved": 0}
                | {"held": held, "orphaned": 0, "unreadable": 0}
            )
        return taken, tallies

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

    ready_later = False  # set by a test: its start pipe closes when the test says (`ready`)
    _on_ready = None

    def when_ready(self, loop, callback):
        if self.ready_later:
            self._on_ready = callback
        else:
            callback()

    def ready(self):
        callback, self._on_ready = self._on_ready, None
        callback()

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

    handed_over = False
    published = {"stdout": 0, "stderr": 0}  # what the test says was published of each stream

    def hand_over(self):
        self.handed_over = True
        return dict(self.published)

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
        self.ready_later = False  # True: each guard is ready when the test says (FakeGuard.ready)

    def __call__(self, spec: GuardSpec):
        if self.error is not None:
            raise self.error
        if self.during is not None:
            self.during()
        guard = FakeGuard(spec.turn_id, spec.record_dir, self.attach_error)
        guard.ready_later = self.ready_later
        self.guards[spec.turn_id] = guard
        if self.hold:
            self.pending[spec.turn_id] = FakePending(guard)
            return self.pending[spec.turn_id]
        return guard


# What a turn used, as `exited` carries it: the fake guard records none, and the clock stands still.
NO_USAGE = {
    "wall_s": 0.0,
    "wait_s": 0.0,
    "cpu_user_s": None,
    "cpu_system_s": None,
    "peak_rss_bytes": None,
    "processes": None,
    "peak_mem": None,
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
        """queue.json as the next supervisor loads it (supervisor.turns.store)."""
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
