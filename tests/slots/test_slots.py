"""The slot gate with real processes and real locks: holders killed, stopped and racing; orphaned
work reaped; pid reuse simulated by records; lowered caps; unreadable state; machine cap and
memory floor."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from conftest import PYTHON, ROOT, wait_until

from guardd import procs
from guardd.procs import Group, Identity
from guardd.record import write_json
from supervisor.caps import MACHINE_KEY, Caps
from supervisor.errors import UsageError
from supervisor.slots.gate import Holder, SlotGate

ME = Holder.this_process(session="test", agent="pytest")

# Ignores SIGTERM, says ready, then lives until killed.
IGNORER = (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "while True: time.sleep(1)\n"
)

# A holder process: acquires one slot, optionally starts work in a new session (ignoring SIGTERM) and
# records it, prints one JSON line, then releases on "release" from stdin.
HOLDER = r"""
import json, os, subprocess, sys
from pathlib import Path
from guardd import procs
from guardd.record import record_dir_scope, write_json
from supervisor.caps import Caps
from supervisor.slots.gate import Holder, SlotGate

state, key, caps_json, mode, turn = sys.argv[1:6]
c = json.loads(caps_json)
gate = SlotGate(Path(state), Caps(caps=c.get("caps", {}), machine_cap=c.get("machine_cap")))
slot = gate.try_acquire(key, Holder.this_process(session="s1", agent="holder"), turn=turn)
if slot is None:
    print(json.dumps({"refused": gate.last_refusal}), flush=True)
    sys.exit(3)
out = {"index": slot.index}

def start(marker, scope=None):
    env = dict(os.environ)
    if marker:
        env["CCSUP_TURN"] = turn
        env["CCSUP_SCOPE"] = scope or record_dir_scope(state)  # the guard record's directory
    p = subprocess.Popen([sys.executable, "-c", IGNORER], start_new_session=True, stdout=subprocess.PIPE, env=env)
    assert p.stdout.readline() == b"ready\n"
    return p

if mode != "nowork":
    work = start(False)
    escapee = start(True)  # in a session nobody recorded: found only by its CCSUP_TURN marker
    # The same turn id run by another state directory's supervisor: never ours to end.
    other = state + ".other"
    os.makedirs(other, exist_ok=True)
    foreign = start(True, scope=record_dir_scope(other))
    out["foreign"] = foreign.pid
    group = procs.Group(work.pid, procs.start_ticks(work.pid))
    me = procs.identity_of(os.getpid())
    guard_record = os.path.join(state, "guard-%d.json" % os.getpid())
    if mode == "guardrecord":  # the group is known only from the guard's own record
        write_json(guard_record, {"v": 1, "own_group": group.to_json(), "groups": []})
        slot.record_work(me, guard_record, [])
    else:
        slot.record_work(me, guard_record, [group])
    out["work"] = work.pid
    out["escapee"] = escapee.pid
print(json.dumps(out), flush=True)
for line in sys.stdin:
    if line.strip() == "release":
        slot.release()
        print("released", flush=True)
""".replace("IGNORER", repr(IGNORER))

# A racer: contends for a slot of key in a loop; each holder checks exclusivity on a witness flock.
RACER = r"""
import fcntl, json, os, random, sys, time
from pathlib import Path
from supervisor.caps import Caps
from supervisor.slots.gate import Holder, SlotGate

state, key, cap, machine_cap, witness, seconds = sys.argv[1:7]
gate = SlotGate(Path(state), Caps(caps={key: int(cap)}, machine_cap=int(machine_cap) or None))
holder = Holder.this_process(agent="racer")
wfd = os.open(witness, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
print("ready", flush=True)
sys.stdin.readline()
deadline = time.monotonic() + float(seconds)
got = violations = 0
while time.monotonic() < deadline:
    slot = gate.try_acquire(key, holder)
    if slot is None:
        time.sleep(random.random() * 0.001)
        continue
    got += 1
    try:
        fcntl.flock(wfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        violations += 1
        slot.release()
        continue
    time.sleep(random.random() * 0.001)
    fcntl.flock(wfd, fcntl.LOCK_UN)
    slot.release()
print(json.dumps({"got": got, "violations": violations}), flush=True)
"""


def child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT)
    return env


def start_holder(state_dir: Path, key: str, caps: dict, mode: str = "nowork", turn: str = "turn-1"):
    """Start a holder; returns (process, its first JSON line)."""
    proc = subprocess.Popen(
        [PYTHON, "-c", HOLDER, str(state_dir), key, json.dumps(caps), mode, turn],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=child_env(),
    )
    line = proc.stdout.readline()
    assert line, f"holder exited early with {proc.wait()}"
    return proc, json.loads(line)


def kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGCONT)
    proc.kill()
    proc.wait()


def states(gate: SlotGate, key: str) -> list[tuple[int, str]]:
    """Each index's state below the cap, and any listed above it: `inspect` lists only the
    indices that have files, so one it does not list is free (no lock, no record)."""
    seen = {v.index: v.state for v in gate.inspect(key)}
    cap = gate._cap(key)
    return [(i, seen.get(i, "free")) for i in sorted(set(range(cap)) | set(seen))]


# ---- 1. the race ---------------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "cap,machine_cap,first_key",
    [(2, 0, "race"), (8, 2, "other")],
    ids=["last-slot-of-the-key", "last-slot-of-the-machine"],
)
def test_racers_for_the_last_slot_never_both_hold_it_even_when_one_is_stopped(
    state_dir, cap, machine_cap, first_key
):
    key, seconds, n = "race", 3.0, 8
    caps = Caps(caps={key: cap, "other": 1}, machine_cap=machine_cap or None)
    gate = SlotGate(state_dir, caps)
    # One slot stays taken (of the key, or of the machine through another key): one slot is left.
    first = gate.try_acquire(first_key, ME)
    assert first.index == 0
    witness = state_dir / "witness"
    racers = [
        subprocess.Popen(
            [
                PYTHON,
                "-c",
                RACER,
                str(state_dir),
                key,
                str(cap),
                str(machine_cap),
                str(witness),
                str(seconds),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=child_env(),
        )
        for _ in range(n)
    ]
    try:
        for r in racers:
            assert r.stdout.readline() == b"ready\n"
        for r in racers:
            r.stdin.write(b"go\n")
            r.stdin.flush()
        stopped = racers[0]
        rng = random.Random()
        stops = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(rng.random() * 0.02)
            stopped.send_signal(signal.SIGSTOP)
            stops += 1
            time.sleep(rng.random() * 0.05)  # stalled at a random point, maybe holding the slot
            stopped.send_signal(signal.SIGCONT)
        results = [json.loads(r.stdout.readline()) for r in racers]
        for r in racers:
            assert r.wait(timeout=10) == 0
    finally:
        for r in racers:
            if r.poll() is None:
                kill(r)
    assert stops > 20
    assert [res["violations"] for res in results] == [0] * n
    assert sum(res["got"] for res in results) > 50, results
    first.release()
    assert states(gate, key) == [(i, "free") for i in range(cap)]
    for path in (state_dir / "slots").glob("*/slot-*.json"):
        assert json.loads(path.read_text())["released"] is True, path
    if machine_cap:
        assert states(gate, MACHINE_KEY) == [(0, "free"), (1, "free")]


# ---- 2. a holder killed with no work -------------------------------------------------------------


def test_holder_killed_without_work_frees_its_slot_at_once(state_dir):
    gate = SlotGate(state_dir, Caps(caps={"codex": 1}))
    proc, line = start_holder(state_dir, "codex", {"caps": {"codex": 1}})
    assert line == {"index": 0}
    assert gate.try_acquire("codex", ME) is None
    assert gate.last_refusal == "key_full"
    [view] = gate.inspect("codex")
    assert (view.state, view.holder["pid"], view.holder["session"], view.turn) == (
        "reserved",
        proc.pid,
        "s1",
        "turn-1",
    )
    proc.kill()
    assert proc.wait() == -signal.SIGKILL
    assert states(gate, "codex") == [(0, "free")]
    slot = gate.try_acquire("codex", ME)
    assert slot is not None and slot.index == 0
    assert (
        slot.took_over["holder"]["pid"] == proc.pid
    )  # the unreleased record, taken over and said so
    assert slot.took_over["released"] is False
    slot.release()


# ---- 3. a holder killed while its work runs: orphaned, then reaped -------------------------------


@pytest.mark.parametrize(
    "mode,machine_cap",
    [("work", None), ("guardrecord", None), ("work", 2)],
    ids=["groups-in-slot-record", "groups-in-guard-record", "with-machine-cap"],
)
def test_orphaned_work_counts_until_reaped(state_dir, mode, machine_cap):
    turn = f"orphan-{uuid.uuid4().hex[:12]}"
    caps = {"caps": {"codex": 1}, "machine_cap": machine_cap}
    gate = SlotGate(state_dir, Caps(caps={"codex": 1}, machine_cap=machine_cap))
    proc, line = start_holder(state_dir, "codex", caps, mode, turn)
    work = procs.identity_of(line["work"])
    escapee = procs.identity_of(line["escapee"])
    foreign = procs.identity_of(line["foreign"])  # same turn id, another state directory
    try:
        [view] = gate.inspect("codex")
        assert (view.state, view.pid, view.turn) == ("held", proc.pid, turn)
        proc.kill()
        proc.wait()
        for _ in range(20):  # never handed out while the work lives
            assert gate.try_acquire("codex", ME) is None
            assert gate.last_refusal == "key_full"
        [view] = gate.inspect("codex")
        assert (view.state, view.pid, view.turn, view.holder["pid"]) == (
            "orphaned",
            proc.pid,
            turn,
            proc.pid,
        )
        if machine_cap:
            assert states(gate, MACHINE_KEY) == [(0, "orphaned"), (1, "free")]
        assert procs.process_running(work) and procs.process_running(escapee)

        reaped = gate.reap(grace=0.3)

        assert sorted((v.key, v.index, v.state) for v in reaped) == sorted(
            [("codex", 0, "orphaned")] + ([(MACHINE_KEY, 0, "orphaned")] if machine_cap else [])
        )
        assert gate.reap_failures == []
        assert not procs.process_running(work)
        assert not procs.process_running(escapee)  # found by its CCSUP_TURN marker
        assert procs.process_running(foreign)  # same CCSUP_TURN, another CCSUP_SCOPE: not ours
        assert states(gate, "codex") == [(0, "free")]
        slot = gate.try_acquire("codex", ME)
        assert (
            slot is not None and slot.index == 0 and slot.took_over is None
        )  # the reaper released it
        slot.release()
    finally:
        for ident in (work, escapee, foreign):
            procs.signal_process(ident, signal.SIGKILL)


def test_reap_leaves_held_and_free_slots_alone(state_dir):
    gate = SlotGate(state_dir, Caps(caps={"codex": 2}))
    slot = gate.try_acquire("codex", ME)
    assert gate.reap(grace=0.1) == []
    assert states(gate, "codex") == [(0, "reserved"), (1, "free")]
    slot.release()


# ---- 4. a stopped holder ---------------------------------------------------------------------------


def test_stopped_holder_keeps_its_slot(state_dir):
    gate = SlotGate(state_dir, Caps(caps={"codex": 1}))
    proc, line = start_holder(state_dir, "codex", {"caps": {"codex": 1}})
    try:
        proc.send_signal(signal.SIGSTOP)
        wait_until(lambda: procs.read_stat(proc.pid).state == "T", what="holder stopped")
        for _ in range(20):
            assert gate.try_acquire("codex", ME) is None
            assert gate.last_refusal == "key_full"
        [view] = gate.inspect("codex")
        assert (view.state, view.holder["pid"]) == ("reserved", proc.pid)
        proc.send_signal(signal.SIGCONT)
        proc.stdin.write(b"release\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == b"released\n"
        slot = gate.try_acquire("codex", ME)
        assert slot is not None and slot.took_over is None
        slot.release()
    finally:
        proc.stdin.close()
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
        proc.wait(timeout=10)


# ---- 5. pid reuse, simulated by records -------------------------------------------------------------


def slot_record(
    key: str,
    *,
    holder: dict,
    work: dict | None,
    released: bool = False,
    index: int = 0,
    cap: int = 1,
):
    return {
        "v": 1,
        "key": key,
        "index": index,
        "cap": cap,
        "holder": holder,
        "turn": "old-turn",
        "reservation": None,
        "work": work,
        "released": released,
        "updated_at": 1.0,
    }


def plant(state_dir: Path, key: str, record: dict, index: int = 0) -> Path:
    directory = state_dir / "slots" / key
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"slot-{index}.lock").touch()
    path = directory / f"slot-{index}.json"
    write_json(path, record)
    return path


def test_record_of_a_pid_now_belonging_to_another_process_is_not_held(state_dir):
    # The recorded holder's pid is this very (live) process, but the start ticks are another's.
    wrong = {"pid": ME.pid, "start": ME.start + 1}
    record = slot_record("codex", holder={**wrong, "session": "old"}, work=None)
    plant(state_dir, "codex", record)
    gate = SlotGate(state_dir, Caps(caps={"codex": 1}))
    assert states(gate, "codex") == [(0, "free")]
    slot = gate.try_acquire("codex", ME)
    assert slot is not None and slot.took_over == record
    slot.release()


def test_recorded_group_whose_id_now_belongs_to_another_group_is_gone(state_dir):
    # A live group (a real process in its own session), recorded with the wrong leader start: gone.
    other = subprocess.Popen(
        [PYTHON, "-c", IGNORER], start_new_session=True, stdout=subprocess.PIPE
    )
    try:
        assert other.stdout.readline() == b"ready\n"
        start = procs.start_ticks(other.pid)
        guard = {"pid": other.pid, "start": start + 1}
        work = {
            "guard": guard,
            "record": None,
            "groups": [{"pgid": other.pid, "leader_start": start + 1}],
        }
        plant(state_dir, "codex", slot_record("codex", holder=guard, work=work))
        gate = SlotGate(state_dir, Caps(caps={"codex": 1}))
        assert states(gate, "codex") == [(0, "free")]
        # The same record with the right leader start: that group lives, the slot is orphaned.
        work["groups"][0]["leader_start"] = start
        plant(state_dir, "codex", slot_record("codex", holder=guard, work=work))
        assert states(gate, "codex") == [(0, "orphaned")]
        assert gate.try_acquire("codex", ME) is None
        work["groups"][0]["leader_start"] = start + 1
        plant(state_dir, "codex", slot_record("codex", holder=guard, work=work))
        slot = gate.try_acquire("codex", ME)
        assert slot is not None and slot.took_over["work"] == work
        slot.release()
    finally:
        other.kill()
        other.wait()


# ---- records of an earlier boot (slot records are not fsynced: supervisor.slots.record) -------------

BOOT_ID = Path("/proc/sys/kernel/random/boot_id").read_text().strip()


@pytest.mark.parametrize(
    "boot, expected",
    [(BOOT_ID, "orphaned"), ("0e5a7a1e-0000-4000-8000-000000000000", "free"), (None, "orphaned")],
    ids=["this-boot", "an-earlier-boot", "no-boot-id-old-record"],
)
def test_a_record_of_an_earlier_boot_with_its_lock_free_is_free(state_dir, boot, expected):
    """Work recorded in an earlier boot cannot run now, even if its pid and start match a process
    of this boot; a record without a boot id (an older ccsup, which fsynced) is judged by its work."""
    live = subprocess.Popen([PYTHON, "-c", IGNORER], start_new_session=True, stdout=subprocess.PIPE)
    try:
        assert live.stdout.readline() == b"ready\n"
        group = {"pgid": live.pid, "leader_start": procs.start_ticks(live.pid)}
        work = {"guard": None, "record": None, "groups": [group]}
        record = slot_record("codex", holder={"pid": 1, "start": 1}, work=work)
        if boot is not None:
            record["boot"] = boot
        plant(state_dir, "codex", record)
        gate = SlotGate(state_dir, Caps(caps={"codex": 1}))
        assert states(gate, "codex") == [(0, expected)]
        slot = gate.try_acquire("codex", ME)
        assert (slot is None) == (expected == "orphaned")
        if slot is not None:
            assert slot.took_over == record  # said, as for any unreleased record taken over
            slot.release()
        reaped = gate.reap("codex", grace=0.5)
        assert [(v.index, v.state) for v in reaped] == (
            [] if expected == "free" else [(0, expected)]
        )
        assert (live.poll() is None) == (expected == "free")  # ended only when of this boot
    finally:
        live.kill()
        live.wait()


@pytest.mark.parametrize("before_boot", [True, False], ids=["changed-before-boot", "this-boot"])
def test_a_torn_record_file_from_before_the_boot_is_free(state_dir, before_boot):
    """An unsynced write torn by a power loss cannot block a slot forever; one of this boot can."""
    directory = state_dir / "slots" / "codex"
    directory.mkdir(parents=True)
    (directory / "slot-0.lock").touch()
    path = directory / "slot-0.json"
    path.write_bytes(b'{"v":1,"key":"co\x00\x00\x00')
    if before_boot:
        btime = next(
            int(line.split()[1]) for line in open("/proc/stat") if line.startswith("btime ")
        )
        os.utime(path, (btime - 60, btime - 60))
    gate = SlotGate(state_dir, Caps(caps={"codex": 1}))
    assert states(gate, "codex") == [(0, "free" if before_boot else "unreadable")]
    slot = gate.try_acquire("codex", ME)
    assert (slot is not None) == before_boot
    if slot is not None:
        slot.release()
        assert json.loads(path.read_text())["released"] is True  # rewritten whole


def test_records_are_written_in_place_never_empty_and_long_ones_whole(state_dir):
    gate = SlotGate(state_dir, Caps(caps={"solo": 1}))
    path = state_dir / "slots" / "solo" / "slot-0.json"
    slot = gate.try_acquire("solo", ME, turn="t1")
    inode = path.stat().st_ino
    many = [Group(100000 + i, i) for i in range(200)]  # a record longer than a page
    slot.record_work(procs.identity_of(os.getpid()), None, many)
    assert path.stat().st_ino != inode and len(path.read_bytes()) > 4096  # replaced whole
    slot.record_work(procs.identity_of(os.getpid()), None, [])
    assert json.loads(path.read_text())["work"]["groups"] == []  # long file: replaced again
    slot.release()
    inode = path.stat().st_ino
    slot = gate.try_acquire("solo", ME, turn="t2")
    slot.bind(turn="t3", reservation=None)
    slot.release()
    assert path.stat().st_ino == inode  # short records: the same file, rewritten in place
    text = path.read_text()
    assert json.loads(text)["turn"] == "t3" and json.loads(text)["released"] is True


def test_slot_files_are_made_ahead_below_each_cap_and_a_grant_then_makes_none(state_dir):
    caps = {"caps": {"pre": 4}}
    holder, line = start_holder(state_dir, "pre", caps)  # another process holds pre#0
    try:
        assert line["index"] == 0
        other = {"pid": 1, "start": 1}
        kept = plant(
            state_dir, "pre", slot_record("pre", holder=other, work=None, released=True), index=2
        )
        kept_text = kept.read_text()
        held_text = (state_dir / "slots" / "pre" / "slot-0.json").read_text()
        gate = SlotGate(state_dir, Caps(caps={"pre": 4, "two": 2}, machine_cap=3))
        assert gate.prepare(ME) == 2 + 2 + 3  # pre#1, pre#3, two#0-1, _machine#0-2
        assert gate.prepare(ME) == 0  # again: all there
        # What had a holder or a record is left as it was; the rest reads free, held by nobody.
        assert (state_dir / "slots" / "pre" / "slot-0.json").read_text() == held_text
        assert kept.read_text() == kept_text
        assert states(gate, "pre") == [(0, "reserved"), (1, "free"), (2, "free"), (3, "free")]
        assert states(gate, "two") == [(0, "free"), (1, "free")]
        assert states(gate, MACHINE_KEY) == [(0, "free"), (1, "free"), (2, "free")]
        made = json.loads((state_dir / "slots" / "pre" / "slot-1.json").read_text())
        assert made["released"] is True and made["work"] is None and made["turn"] is None
        assert made["holder"]["pid"] == os.getpid()
        # A grant now opens what is there: no file is made, the directory does not change.
        directory = state_dir / "slots" / "pre"
        before = (directory.stat().st_mtime_ns, sorted(os.listdir(directory)))
        inode = (directory / "slot-1.json").stat().st_ino
        slot = gate.try_acquire("pre", ME, turn="t1")
        assert slot is not None and slot.index == 1 and slot.took_over is None
        slot.release()
        assert (directory.stat().st_mtime_ns, sorted(os.listdir(directory))) == before
        assert (directory / "slot-1.json").stat().st_ino == inode
        assert json.loads((directory / "slot-1.json").read_text())["turn"] == "t1"
    finally:
        kill(holder)


def test_a_huge_cap_has_only_its_first_indices_made_ahead_and_the_rest_at_first_use(
    state_dir, monkeypatch
):
    from supervisor.slots import gate as slots

    monkeypatch.setattr(slots, "PREPARE_MAX", 3)
    gate = SlotGate(state_dir, Caps(caps={"many": 1_000_000}))
    assert gate.prepare(ME) == 3
    directory = state_dir / "slots" / "many"
    assert len(os.listdir(directory)) == 6  # a lock file and a record for indices 0-2
    held = [gate.try_acquire("many", ME) for _ in range(4)]
    assert [s.index for s in held] == [0, 1, 2, 3]  # index 3 made by its grant
    assert (directory / "slot-3.lock").exists() and (directory / "slot-3.json").exists()
    for slot in held:
        slot.release()


def test_a_grant_tries_only_what_it_does_not_hold_and_lists_the_directory_once(
    state_dir, monkeypatch
):
    from supervisor.slots import views as slot_views

    gate = SlotGate(state_dir, Caps(caps={"wide": 300}))
    held = [gate.try_acquire("wide", ME) for _ in range(299)]
    assert sorted(s.index for s in held) == list(range(299))
    gate.try_acquire("wide", ME).release()  # index 299's first use makes its files
    tries, listings = [], []
    real_try_lock, real_listdir = slot_views._try_lock, os.listdir
    monkeypatch.setattr(slot_views, "_try_lock", lambda p: tries.append(p) or real_try_lock(p))
    monkeypatch.setattr(os, "listdir", lambda p: listings.append(p) or real_listdir(p))
    time.sleep(0.06)  # the directory's last change (a first use) is older than a timestamp tick
    for _ in range(3):
        last = gate.try_acquire("wide", ME)
        assert last.index == 299
        last.release()
    assert len(tries) == 3  # one lock tried per grant, not 300
    assert len(listings) <= 1  # the listing is cached while the directory does not change
    assert gate.try_acquire("wide", ME) is not None
    assert gate.try_acquire("wide", ME) is None  # and the cap still holds
    for slot in held:
        slot.release()


# ---- 7. a lowered cap ------------------------------------------------------------------------------


def test_lowered_cap_keeps_running_holders_and_grants_nothing_until_under_it(state_dir):
    gate = SlotGate(state_dir, Caps(caps={"codex": 3}))
    held = [gate.try_acquire("codex", ME) for _ in range(3)]
    assert [s.index for s in held] == [0, 1, 2]
    gate.caps = Caps(caps={"codex": 1})  # a reload lowers the cap
    assert [(v.index, v.state, v.cap) for v in gate.inspect("codex")] == [
        (0, "reserved", 1),
        (1, "reserved", 1),
        (2, "reserved", 1),
    ]
    held[0].release()  # index 0 is below the cap and free, but two run above it
    assert gate.try_acquire("codex", ME) is None
    assert gate.last_refusal == "key_full"
    assert states(gate, "codex") == [(0, "free"), (1, "reserved"), (2, "reserved")]
    held[2].release()  # one still runs above the cap: the count is 1, not under cap 1
    assert gate.try_acquire("codex", ME) is None
    assert states(gate, "codex") == [
        (0, "free"),
        (1, "reserved"),
    ]  # a free slot above the cap is not listed
    held[1].release()
    slot = gate.try_acquire("codex", ME)
    assert slot is not None and slot.index == 0
    assert gate.try_acquire("codex", ME) is None
    slot.release()
    assert states(gate, "codex") == [(0, "free")]


def test_raised_cap_grants_at_once(state_dir):
    gate = SlotGate(state_dir, Caps(caps={"codex": 1}))
    first = gate.try_acquire("codex", ME)
    assert gate.try_acquire("codex", ME) is None
    gate.caps = Caps(caps={"codex": 2})
    second = gate.try_acquire("codex", ME)
    assert (first.index, second.index) == (0, 1)
    first.release()
    second.release()


# ---- unreadable state ------------------------------------------------------------------------------

UNREADABLE = [
    ("corrupt", b'{"v": 1, "key": "codex", "rel', "is not valid JSON"),
    ("empty", b"", "is not valid JSON"),
    (
        "newer",
        json.dumps({"v": 2, "released": True}).encode(),
        "is version 2, newer than this ccsup knows (1)",
    ),
    ("no-version", json.dumps({"released": True}).encode(), "has no version field 'v'"),
    ("not-object", b"[1]", "does not hold a JSON object"),
    (
        "released-not-bool",
        json.dumps({"v": 1, "released": "yes"}).encode(),
        "'released' is not true or false",
    ),
    (
        "bad-work",
        json.dumps({"v": 1, "released": False, "work": {"guard": {"pid": "x"}}}).encode(),
        "malformed 'work'",
    ),
]


@pytest.mark.parametrize("body,reason", [u[1:] for u in UNREADABLE], ids=[u[0] for u in UNREADABLE])
def test_unreadable_record_counts_as_taken_and_names_the_file(state_dir, body, reason):
    directory = state_dir / "slots" / "codex"
    directory.mkdir(parents=True)
    (directory / "slot-0.json").write_bytes(body)
    gate = SlotGate(state_dir, Caps(caps={"codex": 2}))
    [bad] = gate.inspect("codex")  # slot 1 has no file: free, and not listed
    assert (bad.index, bad.state) == (0, "unreadable")
    assert states(gate, "codex") == [(0, "unreadable"), (1, "free")]
    assert str(directory / "slot-0.json") in bad.error and reason in bad.error
    assert bad.to_json()["error"] == bad.error
    slot = gate.try_acquire("codex", ME)
    assert slot.index == 1  # never slot 0
    assert gate.try_acquire("codex", ME) is None
    assert gate.last_refusal == "unreadable"
    slot.release()
    assert (directory / "slot-0.json").read_bytes() == body  # left for a person to look at


def test_unreadable_slot_directory_counts_every_slot_as_taken(state_dir):
    (state_dir / "slots").mkdir()
    (state_dir / "slots" / "codex").write_text("not a directory")
    gate = SlotGate(state_dir, Caps(caps={"codex": 2}))
    views = gate.inspect("codex")  # one view for the whole key
    assert [(v.index, v.state, v.count) for v in views] == [(0, "unreadable", 2)]
    assert f"unable to read slot directory {state_dir}/slots/codex" in views[0].error
    _, [tally] = gate.survey()
    assert (tally["unreadable"], tally["free"]) == (2, 0)
    assert gate.try_acquire("codex", ME) is None
    assert gate.last_refusal == "unreadable"


def test_unreadable_guard_record_makes_the_slot_unreadable_until_reaped(state_dir):
    guard_record = state_dir / "guard.json"
    guard_record.write_text("{garbage")
    dead = {"pid": ME.pid, "start": ME.start + 1}
    work = {"guard": dead, "record": str(guard_record), "groups": []}
    plant(state_dir, "codex", slot_record("codex", holder=dead, work=work))
    gate = SlotGate(state_dir, Caps(caps={"codex": 1}))
    [view] = gate.inspect("codex")
    assert view.state == "unreadable" and str(guard_record) in view.error
    assert gate.try_acquire("codex", ME) is None
    [reaped] = gate.reap("codex", grace=0.1)  # nothing it knows of runs: released
    assert reaped.index == 0
    slot = gate.try_acquire("codex", ME)
    assert slot is not None and slot.took_over is None
    slot.release()


@pytest.mark.parametrize("body", ["newer", "corrupt"])
def test_a_live_guard_whose_record_is_newer_is_left_to_finish_a_corrupt_ones_is_reaped(
    state_dir, body
):
    """A later release's guard (its record of a version we do not know) cannot be spoken to: the
    reaper never ends it blindly; its slot stays counted until it is gone. A corrupt record of a
    live guard is reaped by what the slot record names (its groups are unknown)."""
    guard = subprocess.Popen(["sleep", "60"])
    try:
        ident = procs.identity_of(guard.pid)
        assert ident is not None
        guard_record = state_dir / "guard.json"
        guard_record.write_text(
            json.dumps({"v": 2, "guard": ident.to_json(), "state": "running"})
            if body == "newer"
            else "{garbage"
        )
        work = {"guard": ident.to_json(), "record": str(guard_record), "groups": []}
        plant(state_dir, "codex", slot_record("codex", holder=ident.to_json(), work=work))
        gate = SlotGate(state_dir, Caps(caps={"codex": 1}))
        assert [v.state for v in gate.inspect("codex")] == ["unreadable"]
        if body == "corrupt":
            assert len(gate.reap("codex", grace=0.1)) == 1 and guard.wait(5) < 0
            return
        assert gate.reap("codex", grace=0.1) == [] and guard.poll() is None
        assert gate.try_acquire("codex", ME) is None  # still counted
        guard.kill()
        guard.wait()
        assert len(gate.reap("codex", grace=0.1)) == 1  # its work is gone: freed
        slot = gate.try_acquire("codex", ME)
        assert slot is not None
        slot.release()
    finally:
        if guard.poll() is None:
            guard.kill()
            guard.wait()


# ---- the machine cap, the memory floor, keys ---------------------------------------------------------


def test_machine_cap_gates_every_key_together(state_dir):
    gate = SlotGate(state_dir, Caps(caps={"a": 2, "b": 2}, machine_cap=2))
    a = gate.try_acquire("a", ME, turn="t-a")
    b = gate.try_acquire("b", ME)
    assert (a.key, a.machine.key, a.machine.index, b.machine.index) == ("a", MACHINE_KEY, 0, 1)
    assert gate.try_acquire("a", ME) is None
    assert gate.last_refusal == "machine_full"
    [m0, m1] = gate.inspect(MACHINE_KEY)  # every index has files now
    assert (m0.state, m0.turn, m1.state) == ("reserved", "t-a", "reserved")
    guard = procs.identity_of(os.getpid())
    a.record_work(guard, "/nonexistent", [Group(os.getpgid(0), None)])
    assert [v.state for v in gate.inspect(MACHINE_KEY)] == ["held", "reserved"]
    assert gate.inspect(MACHINE_KEY)[0].pid == guard.pid
    b.release()
    assert [v.state for v in gate.inspect(MACHINE_KEY)] == ["held", "free"]
    again = gate.try_acquire("b", ME)
    assert again is not None and again.machine.index == 1
    again.release()
    a.release()
    a.release()  # idempotent
    assert {v.state for v in gate.inspect_all()} == {"free"}
    assert [(v.key, v.index) for v in gate.inspect_all()] == [  # the indices that have files
        (MACHINE_KEY, 0),
        (MACHINE_KEY, 1),
        ("a", 0),
        ("b", 0),
    ]


def test_a_full_key_gives_its_machine_slot_back(state_dir):
    gate = SlotGate(state_dir, Caps(caps={"a": 1}, machine_cap=3))
    a = gate.try_acquire("a", ME)
    assert gate.try_acquire("a", ME) is None
    assert gate.last_refusal == "key_full"
    assert states(gate, MACHINE_KEY) == [(0, "reserved"), (1, "free"), (2, "free")]
    a.release()


def test_memory_floor_refuses_every_key_and_touches_nothing(state_dir):
    memory = [100]
    gate = SlotGate(
        state_dir, Caps(caps={"a": 1}, min_free_memory=1000), available_memory=lambda: memory[0]
    )
    assert gate.try_acquire("a", ME) is None
    assert gate.last_refusal == "low_memory"
    assert not (state_dir / "slots").exists()
    memory[0] = 1000
    slot = gate.try_acquire("a", ME)
    assert slot is not None and gate.last_refusal is None
    slot.release()


def test_default_memory_probe_reads_meminfo(state_dir):
    gate = SlotGate(state_dir, Caps())
    assert gate.available_memory() > 0


def test_bare_harness_cap_is_per_key_not_shared(state_dir):
    gate = SlotGate(state_dir, Caps(caps={"opencode": 1}))
    xai = gate.try_acquire("opencode:xai", ME)
    grok = gate.try_acquire("opencode:grok", ME)
    assert xai is not None and grok is not None
    assert gate.try_acquire("opencode:xai", ME) is None
    assert (state_dir / "slots" / "opencode:xai" / "slot-0.lock").exists()
    xai.release()
    grok.release()


@pytest.mark.parametrize("key", [MACHINE_KEY, "", "a b", "../x", "a:b:c"])
def test_bad_key_is_a_usage_error(state_dir, key):
    gate = SlotGate(state_dir, Caps())
    with pytest.raises(UsageError):
        gate.try_acquire(key, ME)


# ---- records and views -------------------------------------------------------------------------------


def test_record_fields_bind_and_work(state_dir):
    clock = iter(range(100, 200)).__next__
    gate = SlotGate(state_dir, Caps(caps={"codex": 1}), clock=lambda: float(clock()))
    holder = Holder.this_process(
        session="S", agent="A", harness="codex", model="m", effort="high", mode="auto"
    )
    slot = gate.try_acquire("codex", holder, turn="t1", reservation={"id": "r1", "until": 5})
    path = state_dir / "slots" / "codex" / "slot-0.json"
    assert json.loads(path.read_text()) == {
        "v": 1,
        "key": "codex",
        "index": 0,
        "cap": 1,
        "holder": holder.to_json(),
        "turn": "t1",
        "reservation": {"id": "r1", "until": 5.0},
        "work": None,
        "released": False,
        "updated_at": 100.0,
        "boot": Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
    }
    assert holder.to_json() == {
        "pid": os.getpid(),
        "start": procs.start_ticks(os.getpid()),
        "session": "S",
        "agent": "A",
        "harness": "codex",
        "model": "m",
        "effort": "high",
        "mode": "auto",
    }
    assert Holder.from_json(holder.to_json()) == holder
    slot.bind(turn="t2", reservation=None)
    slot.record_work(
        Identity(1234, 5678), "/state/guards/1234-5678.json", [Group(1234, 5678), Group(99, None)]
    )
    on_disk = json.loads(path.read_text())
    assert on_disk == slot.record
    assert (on_disk["turn"], on_disk["reservation"], on_disk["updated_at"]) == ("t2", None, 102.0)
    assert on_disk["work"] == {
        "guard": {"pid": 1234, "start": 5678},
        "record": "/state/guards/1234-5678.json",
        "groups": [{"pgid": 1234, "leader_start": 5678}, {"pgid": 99, "leader_start": None}],
    }
    [view] = gate.inspect("codex")
    assert view.to_json() == {
        "key": "codex",
        "index": 0,
        "cap": 1,
        "state": "held",
        "turn": "t2",
        "holder": holder.to_json(),
        "pid": 1234,
        "groups": on_disk["work"]["groups"],
        "since": 102.0,
        "argv": None,
        "cwd": None,
    }
    slot.release()
    assert json.loads(path.read_text())["released"] is True
    assert os.stat(path.parent).st_mode & 0o777 == 0o700
    with pytest.raises(Exception, match="released"):
        slot.bind(turn="t3", reservation=None)


def test_inspect_all_lists_configured_keys_and_keys_found_on_disk(state_dir):
    gate = SlotGate(state_dir, Caps(caps={"codex": 2}))
    SlotGate(state_dir, Caps(caps={"other:x": 1})).try_acquire("other:x", ME).release()
    (state_dir / "slots" / ".stray.tmp").write_text("")
    assert [(v.key, v.index, v.state) for v in gate.inspect_all()] == [("other:x", 0, "free")]
    taken, tallies = gate.survey()
    assert taken == []  # free slots are counted per key, not listed
    assert [(t["key"], t["cap"], t["free"]) for t in tallies] == [
        ("codex", 2, 2),
        ("other:x", 1, 1),
    ]


def test_the_holders_own_views_read_nothing_and_match_what_others_read(state_dir, monkeypatch):
    gate = SlotGate(state_dir, Caps(caps={"codex": 3}, machine_cap=4))
    me = procs.identity_of(os.getpid())
    held = gate.try_acquire("codex", ME, turn="t1")
    held.record_work(me, str(state_dir / "none.json"), [Group(os.getpgid(0), None)])
    reserved = gate.try_acquire("codex", ME, reservation={"id": "r1", "until": 9.0})
    others = [v.to_json() for v in SlotGate(state_dir, gate.caps).inspect_all()]
    opened = []
    real_open = os.open  # records are read with plain descriptors (guardd.record.read_json)
    monkeypatch.setattr("os.open", lambda p, *a, **k: opened.append(p) or real_open(p, *a, **k))
    mine = [v.to_json() for v in gate.inspect_all()]
    assert mine == others
    assert [(s["key"], s["state"], s["turn"]) for s in mine] == [
        ("_machine", "held", "t1"),
        ("_machine", "reserved", None),
        ("codex", "held", "t1"),
        ("codex", "reserved", None),
    ]
    read = sorted(str(p).split("/slots/")[1] for p in opened if str(p).endswith(".json"))
    # its own slots came from memory; the free ones have no files, so nothing was read
    assert read == []
    held.release()
    reserved.release()


# ---- sizes ----------------------------------------------------------------


def test_keys_unused_for_a_week_are_forgotten_by_ps_unless_configured_or_taken(state_dir):
    now = 10_000_000.0
    week = 7 * 86400
    gate = SlotGate(state_dir, Caps(caps={"conf": 2, "old:conf": 1}), clock=lambda: now)
    for key, written in (("old", now - week - 1), ("recent", now - week + 60), ("old:conf", 0.0)):
        SlotGate(state_dir, Caps(caps={key: 1}), clock=lambda w=written: w).try_acquire(
            key, ME
        ).release()
    (state_dir / "slots" / "never").mkdir()  # a directory whose slots were never written
    SlotGate(state_dir, Caps(caps={"tried": 1})).try_acquire("tried", ME).release()
    gate.clock = lambda: now  # "tried" was written at the real time, long after `now`: recent
    old_held = SlotGate(state_dir, Caps(caps={"busy": 1}), clock=lambda: 1.0).try_acquire(
        "busy", ME
    )
    try:
        taken, tallies = gate.survey()
        assert [t["key"] for t in tallies] == ["busy", "conf", "old:conf", "recent", "tried"]
        assert [(v.key, v.state) for v in taken] == [("busy", "reserved")]
    finally:
        old_held.release()
    assert "busy" not in [t["key"] for t in gate.survey()[1]]  # released long ago: forgotten
    assert (state_dir / "slots" / "old" / "slot-0.lock").exists()  # forgotten, never deleted


def test_a_grant_under_a_cap_of_a_million_looks_only_at_the_slots_in_use(state_dir, monkeypatch):
    gate = SlotGate(state_dir, Caps(caps={"big": 1_000_000}))
    slots = [gate.try_acquire("big", ME, turn=f"t{n}") for n in range(3)]
    locked = []
    real_open = os.open
    monkeypatch.setattr("os.open", lambda p, *a, **k: locked.append(p) or real_open(p, *a, **k))
    fourth = gate.try_acquire("big", ME)
    monkeypatch.undo()
    assert fourth.index == 3
    assert [p.rsplit("/", 1)[1] for p in locked if str(p).endswith(".lock")] == ["slot-3.lock"]
    stats = []
    real_stat = os.stat
    monkeypatch.setattr("os.stat", lambda p, *a, **k: stats.append(p) or real_stat(p, *a, **k))
    taken, [tally] = gate.survey()
    monkeypatch.undo()
    assert (len(taken), tally["free"], tally["reserved"]) == (4, 999_996, 4)
    assert len(stats) < 20  # a stat per index below the cap wedged the supervisor (B9)
    for slot in [*slots, fourth]:
        slot.release()
