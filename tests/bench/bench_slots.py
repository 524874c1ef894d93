"""Benchmark the slot gate against a bare flock loop measured in the same run; prints one JSON line.

- acquire_release: try_acquire + release on one key (cap 1), cycles per second. Each cycle writes
  the record twice (at acquire and at release), each in place (supervisor.slots.record).
- bare_flock: flock(LOCK_EX|LOCK_NB) + flock(LOCK_UN) on one open fd, cycles per second
  (goal: acquire_release at most 50x slower).
- acquire_release_cap500_held499: the same cycle on a key of cap 500 with 499 slots held by this
  gate: a grant must not scan the held indices (the ratio to acquire_release shows it is flat).
- record_write_us: one write_slot_record of a slot-sized record; atomic_fsync_write_us: the same
  record the old way (guardd.record.write_json: temp file, fsync, rename), for reference.
- acquire_release_nowrite: the same cycle with the record writes skipped: the gate's locking and
  reading alone (stat, open, flock, identity check, record read), the part comparable to flock.
- inspect_all_ms: inspect_all over 10 keys x 8 slots (half held with work recorded), median.

Run: .venv/bin/python tests/bench/bench_slots.py
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from guardd import procs  # noqa: E402
from guardd.procs import Group  # noqa: E402
from guardd.record import write_json  # noqa: E402
from supervisor.caps import Caps  # noqa: E402
from supervisor.slots import gate as slots_module
from supervisor.slots.gate import Holder, SlotGate  # noqa: E402
from supervisor.slots.record import write_slot_record  # noqa: E402


def per_second(fn, seconds: float) -> float:
    n, start = 0, time.perf_counter()
    deadline = start + seconds
    while True:
        fn()
        n += 1
        if n % 16 == 0 and time.perf_counter() >= deadline:
            break
    return n / (time.perf_counter() - start)


def bench_bare_flock(directory: Path, seconds: float) -> float:
    fd = os.open(directory / "bare.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:

        def cycle():
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)

        return per_second(cycle, seconds)
    finally:
        os.close(fd)


def bench_acquire_release(gate: SlotGate, holder: Holder, seconds: float) -> float:
    def cycle():
        slot = gate.try_acquire("bench", holder)
        slot.release()

    return per_second(cycle, seconds)


def bench_record_write(directory: Path, seconds: float) -> float:
    record = {
        "v": 1,
        "key": "bench",
        "index": 0,
        "cap": 1,
        "holder": Holder.this_process().to_json(),
        "turn": None,
        "reservation": None,
        "work": None,
        "released": False,
        "updated_at": time.time(),
    }
    path = directory / "record.json"
    rate = per_second(lambda: write_slot_record(str(path), record), seconds)
    atomic = per_second(lambda: write_json(path, record, 0o600), seconds)
    return 1e6 / rate, 1e6 / atomic


def bench_held_many(directory: Path, holder: Holder, seconds: float) -> float:
    gate = SlotGate(directory, Caps(caps={"bench": 500}))
    held = [gate.try_acquire("bench", holder) for _ in range(499)]
    try:
        return bench_acquire_release(gate, holder, seconds)
    finally:
        for slot in held:
            slot.release()


def bench_inspect_all(state: Path, holder: Holder, runs: int) -> tuple[float, int]:
    keys = [f"key{i}" for i in range(10)]
    gate = SlotGate(state, Caps(caps={k: 8 for k in keys}))
    me = procs.identity_of(os.getpid())
    held = []
    for key in keys:
        slots = [gate.try_acquire(key, holder) for _ in range(8)]
        for slot in slots[4:]:
            slot.release()
        for slot in slots[:4]:
            slot.record_work(me, str(state / "guards" / "none.json"), [Group(os.getpgid(0), None)])
        held.extend(slots[:4])
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        views = gate.inspect_all()
        times.append(time.perf_counter() - start)
    assert len(views) == 80 and sum(v.state == "held" for v in views) == 40, [
        v.state for v in views
    ]
    for slot in held:
        slot.release()
    return statistics.median(times) * 1e3, len(views)


def main() -> None:
    seconds = float(os.environ.get("BENCH_SECONDS", "2"))
    tmp = Path(tempfile.mkdtemp(prefix="ccsup-bench-", dir="/tmp"))
    try:
        holder = Holder.this_process(agent="bench")
        bare = bench_bare_flock(tmp, seconds)
        gate = SlotGate(tmp / "a", Caps(caps={"bench": 1}))
        gated = bench_acquire_release(gate, holder, seconds)
        many = bench_held_many(tmp / "m", holder, seconds)
        write_us, atomic_us = bench_record_write(tmp, seconds)
        # only for this one: no record at all
        slots_module.write_slot_record = lambda *args, **kwargs: None
        try:
            nowrite = bench_acquire_release(
                SlotGate(tmp / "d", Caps(caps={"bench": 1})), holder, seconds
            )
        finally:
            slots_module.write_slot_record = write_slot_record
        inspect_ms, slots = bench_inspect_all(tmp / "c", holder, 200)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        json.dumps(
            {
                "bench": "slots",
                "bare_flock_per_s": round(bare),
                "acquire_release_per_s": round(gated),
                "ratio_vs_bare": round(bare / gated, 1),
                "goal_ratio": 50,
                "acquire_release_cap500_held499_per_s": round(many),
                "held499_slowdown": round(gated / many, 2),
                "record_write_us": round(write_us, 1),
                "atomic_fsync_write_us": round(atomic_us, 1),
                "two_record_writes_share": round(2 * write_us / (1e6 / gated), 2),
                "acquire_release_nowrite_per_s": round(nowrite),
                "ratio_vs_bare_nowrite": round(bare / nowrite, 1),
                "inspect_all_ms": round(inspect_ms, 3),
                "inspect_all_slots": slots,
                "goal_inspect_all_ms": 5,
            }
        )
    )


if __name__ == "__main__":
    main()
