"""What a waiting turn that carries `env` costs when it leaves, with many such waiters.

    .venv/bin/python tests/bench/bench_env_waiters.py [--sizes 1000,3000] [--leaving 200]
        [--before SOURCE_TREE]

For each size N: a real daemon, cap 1 held by a blocker, N waiters each asked with an `env` of
five variables (an API key's worth); then `leaving` of them are cancelled one at a time over the
control socket, from the back of the queue, each cancel's round trip timed. A waiter's env was
kept in queue.json, so its leaving rewrote the whole file (the env must not outlive the wait in
any file): O(queue length) per leaving turn. Now each waiter's env is a file of its own, removed
when it leaves, so a leaving turn costs one journal line.

Prints one JSON line: per size, `leave_ms_median` (ms per leaving turn, the cancel's round
trip), `leave_cpu_ms` (the daemon's CPU time per leaving turn, from /proc: steadier than wall time
on a loaded machine), `ask_ms_median` (ms per request while filling the queue), and `flat` =
leave_cpu_ms at the largest size / at the smallest (1.0 is flat; O(N) gives about the ratio of
the sizes). `--before DIR`: the same measured, in the same run, with the daemon imported from
another source tree (say a `git worktree` of the commit before), under "before".
`--without-env`: the same waiters without env, under "after_without_env": what a leaving turn
costs anyway at each size (the floor the env-carrying ones are compared with).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_daemon import RUN, start_daemon, stop_daemon  # noqa: E402

from supervisor.client import Client  # noqa: E402

ENV = {f"SECRET_{i}": "sk-" + "x" * 48 for i in range(5)}


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(size: int, leaving: int, source: str | None, env: dict | None = ENV) -> dict:
    state = Path(tempfile.mkdtemp(prefix="ccsup-b10-", dir="/tmp"))
    saved, cwd = os.environ.get("PYTHONPATH"), os.getcwd()
    if source is not None:  # the daemon (a child, `-m supervisor`) imports supervisor from there
        os.environ["PYTHONPATH"] = source
        os.chdir(source)
    try:
        proc = start_daemon(state, "codex = 1")
    finally:
        os.chdir(cwd)
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
    try:
        with Client(state, timeout=30) as client:
            client.turn("codex", ["sleep", "600"], id=f"{RUN}-block")
            asked = []
            for n in range(size):
                at = time.perf_counter()
                client.turn("codex", ["true"], id=f"{RUN}-w{n}", env=env)
                asked.append(time.perf_counter() - at)
            leaves = []
            cpu_at = cpu_seconds(proc.pid)
            for n in reversed(range(size - leaving, size)):
                at = time.perf_counter()
                client.cancel(f"{RUN}-w{n}")
                leaves.append(time.perf_counter() - at)
            cpu = cpu_seconds(proc.pid) - cpu_at
            assert client.status()["waits"] == size - leaving
    finally:
        stop_daemon(proc, state)
        shutil.rmtree(state, ignore_errors=True)
    return {
        "waiters": size,
        "leaving": leaving,
        "leave_ms_median": round(statistics.median(leaves) * 1000, 3),
        "leave_cpu_ms": round(cpu / leaving * 1000, 3),
        "ask_ms_median": round(statistics.median(asked) * 1000, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,3000")
    parser.add_argument("--leaving", type=int, default=200)
    parser.add_argument("--before", help="another ccsup source tree, measured in the same run")
    parser.add_argument(
        "--without-env", action="store_true", help="also waiters without env (the floor)"
    )
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    runs = {"after": None} if args.before is None else {"before": args.before, "after": None}
    out: dict = {"bench": "env_waiters"}
    for name, source in runs.items():
        results = [measure(size, min(args.leaving, size), source) for size in sizes]
        flat = results[-1]["leave_cpu_ms"] / max(results[0]["leave_cpu_ms"], 1e-9)
        out[name] = {"sizes": results, "flat": round(flat, 2)}
    if args.without_env:
        results = [measure(size, min(args.leaving, size), None, None) for size in sizes]
        out["after_without_env"] = {"sizes": results}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
