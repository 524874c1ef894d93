"""What an account pool costs, against a plain key of the same total cap in the same run.

    .venv/bin/python tests/bench/bench_pools.py [--turns 300] [--rounds 3]

Prints one JSON line:
- `pool_s` / `plain_s`: wall time of N turns of `true` asked for the pool `p` of three members
  (caps 1, 2, 1) and for one key of cap 4, through a real daemon, the median of --rounds runs
  each, interleaved (a burst of load then falls on both); `ratio` = pool_s / plain_s.
- `fifo`: the pool's turns were granted in the order asked (every round).
- `members`: how many of the pool's turns each member ran (last round).
- `waiting_grant_ms`: with 3,000 pool turns waiting and every member full, the time of one grant
  pass (`retry_grants`, what every freed slot and the 0.25 s retry run), measured in process
  against the fake gate of the turn logic's tests (the pass asks each member once for the head).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "helpers"))
from bench_admission import run_turns, start_daemon_config  # noqa: E402
from bench_daemon import stop_daemon  # noqa: E402

MEMBERS = {"p:a": 1, "p:b": 2, "p:c": 1}


def write_config(state: Path, pool: bool) -> None:
    caps = ", ".join(f'"{k}" = {v}' for k, v in MEMBERS.items()) if pool else "plain = 4"
    text = f'[slots]\ncaps = {{ {caps} }}\n[guard]\ngrace = "1s"\nscan = "2s"\n'
    if pool:
        text += "[pools]\np = [" + ", ".join(f'"{k}"' for k in MEMBERS) + "]\n"
    (state / "ccsup.toml").write_text(text)


def through(state: Path, turns: int, pool: bool) -> tuple[float, list[str], dict[str, int]]:
    write_config(state, pool)
    proc = start_daemon_config(state)
    key = "p" if pool else "plain"
    try:
        t0 = time.monotonic()
        seen = run_turns(state, key, turns)
        wall = time.monotonic() - t0
    finally:
        stop_daemon(proc, state)
    order = [turn_id for turn_id, _ in sorted(seen["granted"], key=lambda e: e[1])]
    members: dict[str, int] = {}
    if pool:  # from the history: the member each ran on
        import sqlite3

        db = sqlite3.connect(state / "history.sqlite")
        for (member,) in db.execute("SELECT member FROM turns"):
            members[member] = members.get(member, 0) + 1
        db.close()
    return wall, order, members


def waiting_grant_ms(waiters: int = 3000) -> float:
    import asyncio

    from fakes import Harness

    async def main() -> float:
        root = Path(tempfile.mkdtemp(prefix="ccsup-b-", dir="/tmp"))
        try:
            h = Harness(root, caps=dict(MEMBERS))
            import dataclasses

            h.manager.settings = dataclasses.replace(
                h.manager.settings, pools={"p": tuple(MEMBERS)}
            )
            for i in range(waiters):
                h.turn(f"w{i:05d}", key="p")
            t0 = time.perf_counter()
            for _ in range(100):
                h.manager.retry_grants()
            return (time.perf_counter() - t0) / 100 * 1000
        finally:
            shutil.rmtree(root, ignore_errors=True)

    return asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ccsup-b-", dir="/tmp"))
    try:
        pools, plains, fifo = [], [], True
        members: dict[str, int] = {}
        for i in range(args.rounds):
            for pool, times in ((False, plains), (True, pools)):
                state = root / f"{'pool' if pool else 'plain'}{i}"
                state.mkdir(mode=0o700)
                wall, order, seen = through(state, args.turns, pool)
                times.append(wall)
                if pool:
                    fifo = fifo and order == [f"p{n}" for n in range(args.turns)]
                    members = seen
        pool_s, plain_s = statistics.median(pools), statistics.median(plains)
        print(
            json.dumps(
                {
                    "bench": "pools",
                    "turns": args.turns,
                    "pool_s": round(pool_s, 3),
                    "plain_s": round(plain_s, 3),
                    "ratio": round(pool_s / plain_s, 3),
                    "fifo": fifo,
                    "members": members,
                    "waiting_grant_ms": round(waiting_grant_ms(), 3),
                }
            )
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
