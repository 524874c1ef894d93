"""Caps across machines, end to end: two real supervisors (own state dirs, own names: two
machines) on a real 3-member etcd cluster, turns that witness how many run at once
(tests/helpers/cluster_witness.py), and real faults: SIGKILL, SIGSTOP, a killed leader, lost quorum, a
partition made by a relay the test owns, a lowered cap."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from conftest import HELPERS, PYTHON, EventLog, RunningDaemon, wait_until

from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.transport import EtcdSettings

pytestmark = pytest.mark.timeout(90)
WITNESS = str(HELPERS / "cluster_witness.py")
TTL = 2.0
GRACE = 0.3


class Machine(RunningDaemon):
    def __init__(self, name: str, state_dir: Path, config: Path, witness: Path):
        super().__init__(state_dir, config)
        self.name = name
        self.witness = witness
        self.log: EventLog | None = None

    def follow(self) -> EventLog:
        self.log = EventLog(self)
        return self.log

    def turn(self, turn_id: str, seconds: float, key: str = "codex") -> None:
        with self.client() as c:
            c.turn(key, [PYTHON, WITNESS, str(self.witness), str(seconds)], id=turn_id)

    def cluster_status(self) -> dict:
        with self.client() as c:
            return c.status()["cluster"]

    def turn_state(self, turn_id: str) -> str | None:
        with self.client() as c:
            return _state(c, turn_id)

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)


def _state(client, turn_id: str) -> str | None:
    ps = client.ps()
    for slot in ps["slots"]:
        if slot.get("turn") == turn_id:
            return slot["state"]
    for wait in ps["waits"]:
        if wait["id"] == turn_id:
            return "waiting"
    return None


class Cluster:
    """The machines of one test, their witness folder, and an etcd client to look with."""

    def __init__(self, etcd, relay):
        self.etcd = etcd
        self.relay = relay
        self.prefix = f"/t{uuid.uuid4().hex[:8]}"
        self.witness = Path(tempfile.mkdtemp(prefix="ccsup-w-", dir="/tmp"))
        self.machines: list[Machine] = []
        self.client = EtcdClient(EtcdSettings(endpoints=tuple(etcd.endpoints)))

    def machine(
        self, name: str, *, cap: int = 2, endpoints: list[str] | None = None, local_cap: int = 4
    ) -> Machine:
        state_dir = Path(tempfile.mkdtemp(prefix=f"ccsup-{name}-", dir="/tmp"))
        os.chmod(state_dir, 0o700)
        config = state_dir / "ccsup.toml"
        etcd = endpoints or self.etcd.endpoints
        config.write_text(
            f"[slots]\ncaps = {{ codex = {local_cap} }}\n"
            f'[guard]\ngrace = "{int(GRACE * 1000)}ms"\nscan = "200ms"\n'
            f"[cluster]\netcd = {etcd!r}\n".replace("'", '"')
            + f'name = "{name}"\nlease_ttl = "{TTL:g}s"\nprefix = "{self.prefix}"\n'
            f"caps = {{ codex = {cap} }}\n"
        )
        m = Machine(name, state_dir, config, self.witness)
        self.machines.append(m)
        m.start()
        wait_until(lambda: m.cluster_status().get("connected"), what=f"{name} connected")
        return m

    def queued(self, m: Machine, turn_id: str) -> None:
        """Wait until the turn's key is in the cluster queue (so request order is fixed)."""
        key = f"{self.prefix}/q/codex/{m.name}/{turn_id}"
        wait_until(lambda: self.client.get(key) is not None, what=f"{key} in etcd")

    def begins(self) -> list[tuple[str, float, int]]:
        path = self.witness / "witness"
        if not path.exists():
            return []
        found = []
        for line in path.read_text().splitlines():
            _, turn, at, running, _names = line.split()
            found.append((turn, float(at), int(running)))
        return found

    def running_at_begin(self, turn_id: str) -> set[str]:
        """The turns that held their witness lock when `turn_id` began (itself included)."""
        for line in (self.witness / "witness").read_text().splitlines():
            _, turn, _, _, names = line.split()
            if turn == turn_id:
                return set(names.split(","))
        raise AssertionError(f"{turn_id} never began")

    def most_running(self) -> int:
        return max((r for _, _, r in self.begins()), default=0)

    def close(self) -> None:
        for m in self.machines:
            if m.proc is not None and m.proc.poll() is None:
                m.proc.send_signal(signal.SIGCONT)
                try:
                    m.stop(timeout=20)
                except Exception:
                    m.kill()
            if m.log is not None:
                m.log.close()
            shutil.rmtree(m.state_dir, ignore_errors=True)
        shutil.rmtree(self.witness, ignore_errors=True)


@pytest.fixture
def cluster(etcd_shared, relay):
    """Machines on the module's etcd cluster (each test under a prefix of its own)."""
    c = Cluster(etcd_shared, relay)
    yield c
    c.close()


@pytest.fixture
def cluster_alone(etcd_cluster, relay):
    """Machines on an etcd cluster of the test's own, for tests that stop its members."""
    c = Cluster(etcd_cluster, relay)
    yield c
    c.close()


def released(m: Machine, turn_id: str, timeout: float = 20) -> dict:
    assert m.log is not None
    return m.log.wait_for(f"turn.{turn_id}.released", timeout)


def test_a_cap_of_2_holds_across_two_machines_in_request_order(cluster):
    a, b = cluster.machine("a"), cluster.machine("b")
    for m in (a, b):
        m.follow()
    order = []
    for i in range(12):
        m = (a, b)[i % 2]
        turn_id = f"t{i:02d}"
        # Durations differ, so no two grants after the first two happen within 50 ms.
        m.turn(turn_id, 0.1 + 0.05 * i)
        cluster.queued(m, turn_id)
        order.append((m, turn_id))
    for m, turn_id in order:
        released(m, turn_id, timeout=30)
    assert len(cluster.begins()) == 12
    assert cluster.most_running() == 2
    # The order of grants: each supervisor stamps its events (`ts`) on the same clock here.
    granted = sorted(
        (m.log.wait_for(f"turn.{turn_id}.granted")["ts"], turn_id) for m, turn_id in order
    )
    assert sorted(t for _, t in granted[:2]) == ["t00", "t01"]
    # Request order, cap by cap: each later grant goes to one of the two oldest still waiting.
    # (Two slots freed close together grant those two in either order: under two CPU hogs t05's
    # grant was stamped before t04's, both of them among the first two waiting.)
    waiting = [f"t{i:02d}" for i in range(2, 12)]
    for _, turn_id in granted[2:]:
        assert turn_id in waiting[:2], (turn_id, waiting)
        waiting.remove(turn_id)


def hold_two(cluster, m: Machine, names=("a1", "a2")) -> None:
    """m runs two turns that last until ended, holding both cluster slots."""
    for turn_id in names:
        m.turn(turn_id, -1)
        cluster.queued(m, turn_id)
    wait_until(lambda: len(cluster.begins()) == len(names), what="both running")


def test_sigkill_of_a_supervisor_mid_turn(cluster):
    a, b = cluster.machine("a"), cluster.machine("b")
    b.follow()
    hold_two(cluster, a)
    b.turn("b1", 0.1)
    cluster.queued(b, "b1")
    killed_at = time.monotonic()
    a.kill()
    released(b, "b1")
    begins = cluster.begins()
    assert [t for t, _, _ in begins][2:] == ["b1"]
    _, began, running = begins[2]
    assert running == 1  # a's guards had ended its work: a1 and a2 no longer ran
    assert began - killed_at > TTL / 2  # not before a's lease ran out in etcd
    assert cluster.client.range(f"{cluster.prefix}/q/codex/a/", prefix=True).kvs == []


def test_sigstop_longer_than_the_ttl_ends_turns_by_their_deadline_then_rejoins(cluster):
    a, b = cluster.machine("a"), cluster.machine("b")
    a.follow()
    b.follow()
    hold_two(cluster, a)
    for turn_id in ("b1", "b2"):
        b.turn(turn_id, 0.2)
        cluster.queued(b, turn_id)
    a.signal(signal.SIGSTOP)
    for turn_id in ("b1", "b2"):
        released(b, turn_id)
    begins = cluster.begins()
    assert sorted(t for t, _, _ in begins[:2]) == ["a1", "a2"]
    assert sorted(t for t, _, _ in begins[2:]) == ["b1", "b2"]
    for turn_id in ("b1", "b2"):  # the dead-man deadline ended a1 and a2 before b's turns began
        assert cluster.running_at_begin(turn_id).isdisjoint({"a1", "a2"})
    assert cluster.most_running() == 2
    a.signal(signal.SIGCONT)
    for turn_id in ("a1", "a2"):
        released(a, turn_id)
    assert a.log.wait_for("cluster.fenced")["turns"] in (["a1", "a2"], ["a2", "a1"], [])
    wait_until(lambda: a.log.topics().count("cluster.connected") >= 1, what="a back")
    wait_until(lambda: a.cluster_status()["connected"], what="a connected")
    a.turn("a3", 0.1)
    released(a, "a3")
    assert [t for t, _, _ in cluster.begins()].count("a1") == 1  # nothing granted twice
    assert cluster.most_running() == 2


def test_the_etcd_leader_killed_while_turns_run_and_wait(cluster_alone):
    cluster = cluster_alone
    a, b = cluster.machine("a"), cluster.machine("b")
    for m in (a, b):
        m.follow()
    order = []
    for i in range(6):
        m = (a, b)[i % 2]
        m.turn(f"t{i}", 0.4)
        cluster.queued(m, f"t{i}")
        order.append((m, f"t{i}"))
    wait_until(lambda: len(cluster.begins()) >= 2, what="two running")
    cluster.etcd.leader().kill()
    for m, turn_id in order:
        released(m, turn_id, timeout=30)
    assert len(cluster.begins()) == 6
    assert cluster.most_running() == 2


def test_two_of_three_members_stopped_fences_then_grants_resume(cluster_alone):
    cluster = cluster_alone
    a, b = cluster.machine("a"), cluster.machine("b")
    a.follow()
    b.follow()
    hold_two(cluster, a)
    b.turn("b1", 0.1)
    cluster.queued(b, "b1")
    stopped = cluster.etcd.members[1:]
    for member in stopped:
        member.kill()
    fenced = a.log.wait_for("cluster.fenced", timeout=TTL + 3)
    fenced_at = a.log.time_of("cluster.fenced")
    assert sorted(fenced["turns"]) == ["a1", "a2"]
    assert fenced["deadline_in"] > GRACE  # the guards' grace fits before the lease deadline
    for turn_id in ("a1", "a2"):
        a.log.wait_for(f"turn.{turn_id}.gone")
        assert a.log.time_of(f"turn.{turn_id}.gone") < fenced_at + fenced["deadline_in"]
    b.log.wait_for("cluster.fenced", timeout=TTL + 3)
    assert sorted(t for t, _, _ in cluster.begins()) == ["a1", "a2"]  # no grant without quorum
    for member in stopped:
        cluster.etcd.start_member(member)
    released(b, "b1", timeout=30)
    last = "b1"
    exited = b.log.find("turn.b1.exited")
    if exited and exited[-1].get("reason") and "b1" not in [t for t, _, _ in cluster.begins()]:
        # granted as quorum came back, and stopped before its command began (its lease lost once
        # more, or its deadline passed: members just started, on a loaded machine; seen beside
        # two hogs). Grants go on.
        b.turn("b2", 0.1)
        released(b, "b2", timeout=30)
        last = "b2"
    assert cluster.begins()[-1][0] == last and cluster.most_running() == 2, (
        cluster.begins(),
        exited,
        b.log.topics("turn.b"),
    )


def test_a_partition_between_a_supervisor_and_etcd_is_a_lost_lease(cluster):
    relays = [cluster.relay(("127.0.0.1", m.client_port)) for m in cluster.etcd.members]
    a = cluster.machine("a", endpoints=[r.url for r in relays])
    b = cluster.machine("b")
    a.follow()
    b.follow()
    hold_two(cluster, a)
    b.turn("b1", 0.1)
    cluster.queued(b, "b1")
    for r in relays:
        r.block()
    a.log.wait_for("cluster.lost", timeout=TTL + 2)
    fenced = a.log.wait_for("cluster.fenced", timeout=TTL + 2)
    assert sorted(fenced["turns"]) == ["a1", "a2"]
    released(b, "b1")
    assert cluster.begins()[-1][0] == "b1" and cluster.begins()[-1][2] == 1
    for r in relays:
        r.unblock()
    wait_until(lambda: a.cluster_status()["connected"], timeout=15, what="a reconnected")
    a.turn("a3", 0.1)
    released(a, "a3")
    assert cluster.most_running() == 2


def test_a_cap_lowered_while_turns_run_grants_nothing_until_under_it(cluster):
    a, b = cluster.machine("a", cap=3), cluster.machine("b", cap=3)
    a.follow()
    b.follow()
    hold_two(cluster, a, ("a1", "a2", "a3"))
    b.turn("b1", 0.1)
    cluster.queued(b, "b1")
    # a's config is lowered; b's still says 3: b grants by the value stored in etcd.
    text = a.config.read_text().replace("caps = { codex = 3 }", "caps = { codex = 1 }")
    a.config.write_text(text)
    with a.client() as c:
        c.reload()
    # The change, not b's first word on the cap (3, was None), which a loaded machine can deliver
    # after b's subscription began.
    change = wait_until(
        lambda: next((e for e in b.log.find("cluster.cap") if e["cap"] == 1), None),
        what="b to see the lowered cap",
    )
    assert (change["key"], change["cap"], change["was"]) == ("codex", 1, 3)
    for turn_id in ("a1", "a2"):
        with a.client() as c:
            c.cancel(turn_id)
        released(a, turn_id)
        # Still at or over the cap of 1: b1 must not start. (A grant follows a release within
        # milliseconds here; a quarter second without one is the observation window.)
        time.sleep(0.25)
        assert sorted(t for t, _, _ in cluster.begins()) == ["a1", "a2", "a3"]
    with a.client() as c:
        c.cancel("a3")
    released(b, "b1")
    assert cluster.begins()[-1][0] == "b1"


def test_ps_and_status_show_the_cluster(cluster):
    a, b = cluster.machine("a"), cluster.machine("b")
    for m, turn_id in ((a, "a1"), (b, "b1"), (a, "a2"), (b, "b2"), (a, "a3")):
        m.turn(turn_id, -1)
        cluster.queued(m, turn_id)
    wait_until(lambda: len(cluster.begins()) == 2, what="two running")
    with a.client() as c:
        (view,) = c.ps()["cluster"]
    assert (view["key"], view["cap"]) == ("codex", 2)
    assert [(h["machine"], h["turn"]) for h in view["holders"]] == [("a", "a1"), ("b", "b1")]
    assert [(w["machine"], w["turn"]) for w in view["waiting"]] == [
        ("a", "a2"),
        ("b", "b2"),
        ("a", "a3"),
    ]
    assert view["local_waiters"] == [{"turn": "a2", "position": 1}, {"turn": "a3", "position": 3}]
    with b.client() as c:
        assert c.ps()["cluster"][0]["local_waiters"] == [{"turn": "b2", "position": 2}]
        status = c.status()["cluster"]
    assert (status["name"], status["connected"], status["fenced"]) == ("b", True, False)
    assert status["lease"] and status["lease_ttl"] == TTL
    assert 0 < status["deadline_in"] <= TTL
    assert [m["ok"] for m in status["members"]] == [True, True, True]
    assert sum(m["leader"] for m in status["members"]) == 1
    assert status["caps"] == {"codex": 2}
    # The same, as people read it.
    ps_text = ccsup(a, "ps")
    assert "cluster key codex: cap 2 across machines" in ps_text
    assert re.search(r"^a +a1 +- +\S+$", ps_text, re.M) and re.search(r"^b +b1 ", ps_text, re.M)
    assert "3 waiting across machines; here: a2 (position 1), a3 (position 3)" in ps_text
    status_text = ccsup(b, "status")
    assert re.search(
        r"^cluster b under /t\w+: connected, lease [0-9a-f]+ \(ttl 2s\), deadline in",
        status_text,
        re.M,
    )
    assert re.search(r"^etcd +3/3 healthy: ", status_text, re.M)


def ccsup(m: Machine, *args: str) -> str:
    done = subprocess.run(
        [PYTHON, "-m", "supervisor", "--state-dir", str(m.state_dir), *args],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_restarted_supervisor_joins_its_waiting_turns_again(cluster):
    a, b = cluster.machine("a", cap=1), cluster.machine("b", cap=1)
    b.follow()
    a.turn("a1", -1)
    cluster.queued(a, "a1")
    wait_until(lambda: len(cluster.begins()) == 1, what="a1 running")
    a.turn("a2", 0.1)
    cluster.queued(a, "a2")
    b.turn("b1", 0.1)
    cluster.queued(b, "b1")
    a.kill()
    a.start()  # the same state dir: a2 is restored from queue.json, under a new lease
    # A cluster turn is not adopted (its guard has no adopt_within: the lease that counted it
    # died with its supervisor; supervisor.turns.adopt): a1 ended with it, else b1 never ran.
    with a.client() as c:
        assert c.status()["adopted"] == 0
    a.follow()
    released(b, "b1")  # its key is older than a2's new one
    released(a, "a2")
    assert [t for t, _, _ in cluster.begins()] == ["a1", "b1", "a2"]
    assert cluster.most_running() == 1


def test_a_turn_bound_to_a_reservation_keeps_its_cluster_slot(cluster):
    a, b = cluster.machine("a", cap=1), cluster.machine("b", cap=1)
    a.follow()
    b.follow()
    holder = {"session": "s1", "agent": "x"}
    for res_id in ("r1", "r2"):  # r1 is held at once; r2 waits behind it
        with a.client() as c:
            c.reserve("codex", holder={**holder, "agent": res_id}, id=res_id)
    cluster.queued(a, "r2")
    b.turn("b1", 0.1)
    cluster.queued(b, "b1")
    a.log.wait_for("turn.r1.granted")
    argv = [PYTHON, WITNESS, str(cluster.witness)]
    with a.client() as c:  # a turn takes r1's slot at once, another r2's place in the queue
        c.turn("codex", [*argv, "-1"], id="a1", reservation="r1", holder={**holder, "agent": "r1"})
        c.turn("codex", [*argv, "0.1"], id="a2", reservation="r2", holder={**holder, "agent": "r2"})
    wait_until(lambda: len(cluster.begins()) == 1, what="a1 running")
    queue = cluster.client.range(f"{cluster.prefix}/q/codex/", prefix=True, sort_target="CREATE",
                                 sort_order="ASCEND").kvs  # fmt: skip
    # r1's and r2's keys (a1's and a2's now: neither turn made a key of its own), ahead of b1's.
    # Between the two, the order their puts finished: two may run at once (try_take swaps).
    places = [kv.key.rsplit("/", 2)[1:] for kv in queue]
    assert sorted(places[:2]) == [["a", "r1"], ["a", "r2"]] and places[2:] == [["b", "b1"]]
    with a.client() as c:
        (slot,) = [s for s in c.ps()["slots"] if s["turn"] == "a1"]
    # The guard (forked by the zygote, so its own /proc environ is the zygote's) hands its
    # environment to the command it runs: the command's shows what the guard was given.
    guard = slot["pid"]
    (cmd,) = Path(f"/proc/{guard}/task/{guard}/children").read_text().split()
    environ = Path(f"/proc/{cmd}/environ").read_bytes().split(b"\0")
    assert f"CCSUP_GUARD_DEADLINE_FILE={a.state_dir}/cluster/deadline.json".encode() in environ
    with a.client() as c:
        c.cancel("a1")
    released(a, "a2")  # r2's place, before b1
    released(b, "b1")
    assert [t for t, _, _ in cluster.begins()] == ["a1", "a2", "b1"]
    assert cluster.most_running() == 1
    wait_until(
        lambda: not cluster.client.range(f"{cluster.prefix}/q/", prefix=True).kvs,
        what="every queue key deleted",
    )


def test_a_window_read_on_one_machine_holds_the_key_on_the_other(cluster):
    a, b = cluster.machine("a"), cluster.machine("b")
    log_b = b.follow()
    resets_at = time.time() + 4.0
    with a.client() as c:
        c.call("quota", action="set", key="codex", window="5h", used=0.99, resets_at=resets_at)
    name = f"{cluster.prefix}/quota/codex/5h"
    wait_until(lambda: cluster.client.get(name) is not None, what="the window in etcd")
    assert json.loads(cluster.client.get(name).value)["used"] == 0.99
    with b.client() as c:
        wait_until(
            lambda: c.call("quota", action="show", key="codex")["keys"][0]["held"] is not None,
            what="a's window on b",
        )
        b.turn("held", 0.1)
        assert c.ps()["waits"][0]["why"]["reason"] == "quota"
    released(b, "held", timeout=30)
    granted = log_b.find("turn.held.granted")[0]["ts"]
    assert resets_at <= granted < resets_at + 1.0
    # A clear on one machine frees the key on the other.
    with a.client() as c:
        c.call("quota", action="set", key="codex", window="7d", used=1.0,
               resets_at=time.time() + 600)  # fmt: skip
    with b.client() as c:
        wait_until(lambda: c.call("quota", action="show")["keys"], what="the 7d window on b")
        b.turn("freed", 0.1)
        assert c.ps()["waits"][0]["why"]["reason"] == "quota"
    with a.client() as c:
        c.call("quota", action="clear", key="codex")
    released(b, "freed", timeout=30)
    wait_until(lambda: cluster.client.get(f"{cluster.prefix}/quota/codex/7d") is None,
               what="the 7d window deleted")  # fmt: skip


def test_a_running_turn_whose_cluster_key_vanishes_is_stopped_by_its_supervisor(cluster):
    """The gate's stop reaches the manager (supervisor.cluster.wiring.ManagerListener): a running
    turn's key deleted by hand, its lease alive (no deadline would end it), is stopped at once
    with reason cluster_key_lost and its work ends."""
    a = cluster.machine("a", cap=1)
    log = a.follow()
    a.turn("a1", -1)  # runs until ended
    cluster.queued(a, "a1")
    wait_until(lambda: len(cluster.begins()) == 1, what="a1 running")
    assert cluster.client.delete(f"{cluster.prefix}/q/codex/a/a1") == 1
    assert log.wait_for("turn.a1.stopping", timeout=10)["reason"] == "cluster_key_lost"
    released(a, "a1")  # its work confirmed gone
    assert a.cluster_status()["connected"]  # the lease lives on: only the turn was stopped
