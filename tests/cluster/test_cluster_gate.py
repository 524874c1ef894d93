"""The cluster gate (supervisor.cluster.gate) against a real 3-member etcd: gates with different names
are different machines. The manager is replaced by a listener of the gate (wake, stop_turn) and a
publish, each call recorded with its time on CLOCK_BOOTTIME."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from guardd import deadman
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.gate import ClusterGate
from supervisor.cluster.transport import EtcdSettings
from supervisor.config.cluster import FENCE_MARGIN, ClusterSettings

pytestmark = pytest.mark.timeout(60)
TTL = 2.0
GRACE = 0.3


class Machine:
    def __init__(self, name: str, endpoints: list[str], prefix: str, tmp: Path, caps: dict):
        settings = ClusterSettings(
            etcd=tuple(endpoints), name=name, lease_ttl=TTL, prefix=prefix, caps=caps, timeout=0.5
        )
        self.events: list[tuple[str, dict, float]] = []
        self.stopped: dict[str, tuple[str, float]] = {}
        self.wakes = 0
        self.deadline_file = tmp / f"{name}.deadman"
        self.gate = ClusterGate(
            settings,
            deadline_file=self.deadline_file,
            grace=GRACE,
            publish=lambda topic, body: self.events.append((topic, body, deadman.boottime())),
        )
        self.gate.listeners.append(self)

    def wake(self) -> None:
        self.wakes += 1

    def stop_turn(self, turn: str, why: str) -> None:
        self.stopped.setdefault(turn, (why, deadman.boottime()))

    def topics(self) -> list[str]:
        return [t for t, _, _ in self.events]

    def granted(self, turns: list[str]) -> list[str]:
        """try_take for each turn (as the manager's grant loop does); the ones granted now."""
        return [t for t in turns if self.gate.try_take("codex", t)]


async def until(predicate, timeout: float = 10.0, what: str = "condition"):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if loop.time() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.01)


async def joined(m: Machine, turn: str) -> None:
    m.gate.join("codex", turn)
    await until(lambda: m.gate.entries[turn].revision, what=f"{turn} queued")


@pytest.fixture
def prefix():
    return f"/ccsup-{uuid.uuid4().hex[:8]}"


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 50))


def test_a_cluster_cap_holds_across_machines_in_request_order(etcd_shared, prefix, tmp_path):
    async def scenario():
        a = Machine("a", etcd_shared.endpoints, prefix, tmp_path, {"codex": 2})
        b = Machine("b", etcd_shared.endpoints, prefix, tmp_path, {"codex": 2})
        for m in (a, b):
            m.gate.start()
        await until(lambda: a.gate.may_grant() and b.gate.may_grant(), what="both connected")
        assert a.topics()[:1] == ["cluster.connected"]
        order = []  # requests alternate between the machines
        for i in range(6):
            m = (b, a)[i % 2]
            turn = f"t{i}"
            await joined(m, turn)
            order.append((m, turn))
        running: list[tuple[Machine, str]] = []
        grants: list[str] = []
        while len(grants) < 6:
            for m, turn in order:
                if turn not in grants and m.gate.try_take("codex", turn):
                    grants.append(turn)
                    running.append((m, turn))
            assert len(running) <= 2
            if len(running) == 2 or len(grants) == 6:
                m, turn = running.pop(0)
                m.gate.release(turn)
            await asyncio.sleep(0.01)
        assert grants == [f"t{i}" for i in range(6)]
        for m in (a, b):
            await m.gate.close()
        assert all(not w for w in (a.stopped, b.stopped))

    run(scenario())


def test_a_release_wakes_the_other_machine_through_the_watch(etcd_shared, prefix, tmp_path):
    async def scenario():
        a = Machine("a", etcd_shared.endpoints, prefix, tmp_path, {"codex": 1})
        b = Machine("b", etcd_shared.endpoints, prefix, tmp_path, {"codex": 1})
        for m in (a, b):
            m.gate.start()
        await until(lambda: a.gate.may_grant() and b.gate.may_grant(), what="connected")
        await joined(a, "first")
        await joined(b, "second")
        await until(lambda: a.granted(["first"]), what="first granted")
        await asyncio.sleep(0.2)
        assert b.granted(["second"]) == []
        wakes = b.wakes
        a.gate.release("first")
        await until(lambda: b.wakes > wakes, what="b woken by the watch")
        assert b.granted(["second"]) == ["second"]
        views = await b.gate.view()
        assert [(v["key"], v["cap"]) for v in views] == [("codex", 1)]
        assert [(h["machine"], h["turn"]) for h in views[0]["holders"]] == [("b", "second")]
        for m in (a, b):
            await m.gate.close()

    run(scenario())


def test_a_lowered_cap_grants_nothing_until_under_it(etcd_shared, prefix, tmp_path):
    async def scenario():
        a = Machine("a", etcd_shared.endpoints, prefix, tmp_path, {"codex": 3})
        b = Machine("b", etcd_shared.endpoints, prefix, tmp_path, {"codex": 3})
        for m in (a, b):
            m.gate.start()
        await until(lambda: a.gate.may_grant() and b.gate.may_grant(), what="connected")
        for t in ("r1", "r2", "r3"):
            await joined(a, t)
        # try_take is true once per turn: under load the three may come in different rounds
        held: set[str] = set()

        def all_held() -> bool:
            held.update(a.granted(sorted({"r1", "r2", "r3"} - held)))
            return len(held) == 3

        await until(all_held, what="three held")
        await b.gate.set_caps({"codex": 1})  # b's config lowered and reloaded
        await until(lambda: a.gate.cap_of("codex") == 1, what="a sees the new cap")
        assert ("cluster.cap", {"key": "codex", "cap": 1, "was": 3}) in [
            (t, body) for t, body, _ in a.events
        ]
        await joined(b, "w")
        for t in ("r1", "r2"):
            a.gate.release(t)
            await until(lambda t=t: t not in a.gate.entries, what=f"{t} released")
            await asyncio.sleep(0.1)
            assert b.granted(["w"]) == [], "granted while at or over the lowered cap"
        a.gate.release("r3")
        await until(lambda: b.granted(["w"]), what="w granted once under the cap")
        for m in (a, b):
            await m.gate.close()

    run(scenario())


def test_a_revoked_lease_stops_the_turns_it_held_at_once(etcd_shared, prefix, tmp_path):
    async def scenario():
        a = Machine("a", etcd_shared.endpoints, prefix, tmp_path, {"codex": 2})
        a.gate.start()
        await until(a.gate.may_grant, what="connected")
        await joined(a, "t")
        await until(lambda: a.granted(["t"]), what="granted")
        outsider = EtcdClient(EtcdSettings(endpoints=tuple(etcd_shared.endpoints)))
        revoked_at = deadman.boottime()
        await asyncio.to_thread(outsider.lease_revoke, a.gate.lease)
        await until(lambda: "t" in a.stopped, timeout=5, what="t stopped")
        why, at = a.stopped["t"]
        assert why in ("cluster_key_lost", "cluster_lease_gone")
        assert at - revoked_at < 1.5
        # A new lease follows; nothing is granted twice.
        await until(lambda: a.topics().count("cluster.connected") == 2, what="a new lease")
        assert a.gate.may_grant()
        a.gate.release("t")
        await a.gate.close()

    run(scenario())


def test_a_partitioned_machine_fences_before_its_lease_deadline(
    etcd_shared, prefix, tmp_path, relay
):
    async def scenario():
        relays = [relay(("127.0.0.1", m.client_port)) for m in etcd_shared.members]
        a = Machine("a", [r.url for r in relays], prefix, tmp_path, {"codex": 1})
        b = Machine("b", etcd_shared.endpoints, prefix, tmp_path, {"codex": 1})
        for m in (a, b):
            m.gate.start()
        await until(lambda: a.gate.may_grant() and b.gate.may_grant(), what="connected")
        await joined(a, "held")
        await joined(b, "waits")
        await until(lambda: a.granted(["held"]), what="a holds")
        for r in relays:
            r.block()
        cut_at = deadman.boottime()
        await until(lambda: "held" in a.stopped, timeout=TTL + 2, what="a fenced")
        why, fenced_at = a.stopped["held"]
        assert why == "cluster_lease_deadline"
        deadline = a.gate.deadline
        assert fenced_at <= deadline - GRACE - FENCE_MARGIN + 0.1
        assert a.topics()[-2:] == ["cluster.lost", "cluster.fenced"]
        assert not a.gate.may_grant()
        # The guards read the same moment: the deadline file was not pushed past it.
        stop_at, kill_at, why_not = deadman.read_deadline(a.deadline_file)
        assert why_not is None and stop_at == deadline - GRACE - FENCE_MARGIN
        # b gets the slot only when etcd has let a's lease expire: after D.
        await until(lambda: b.granted(["waits"]), timeout=TTL + 3, what="b granted")
        assert deadman.boottime() >= deadline
        assert deadman.boottime() - cut_at < TTL + 2
        for r in relays:
            r.unblock()
        # a comes back with a new lease; its old turn's key is gone; it grants nothing twice.
        await until(lambda: a.gate.may_grant(), timeout=10, what="a reconnected")
        a.gate.release("held")
        for m in (a, b):
            await m.gate.close()

    run(scenario())


def test_a_machine_hands_its_place_to_its_own_earlier_waiter(etcd_shared, prefix, tmp_path):
    """The local queue's order may differ from the order the keys were created: the place goes to
    the turn the machine grants, never left unused (and never a second place taken)."""

    async def scenario():
        a = Machine("a", etcd_shared.endpoints, prefix, tmp_path, {"codex": 1})
        a.gate.start()
        await until(a.gate.may_grant, what="connected")
        await joined(a, "late")  # its key was created first ...
        await joined(a, "head")  # ... but the local queue puts this one first
        await until(lambda: a.gate.entries["late"].state == "ready", what="late's key first")
        assert a.granted(["head"]) == ["head"]  # head takes the first place
        assert a.granted(["late"]) == []  # late now has head's key: not among the first 1
        views = await a.gate.view()
        assert [h["turn"] for h in views[0]["holders"]] == ["head"]
        assert views[0]["local_waiters"] == [{"turn": "late", "position": 1}]
        a.gate.release("head")
        await until(lambda: a.granted(["late"]), what="late granted after head")
        a.gate.release("late")
        await until(lambda: not a.gate.entries, what="all released")
        keys = await asyncio.to_thread(a.gate.client.range, f"{prefix}/q/", prefix=True)
        assert keys.kvs == []
        await a.gate.close()

    run(scenario())
