"""Sidecars each following their own turn while every turn streams output; prints one JSON line.

    .venv/bin/python tests/bench/bench_sidecars.py [--mb 20] [--many 10] [--node]

One supervisor (cap = many). For N = 1 and N = many, N sidecar processes (Python clients) each
subscribe, wait for a common go, request their own turn (`yes <mixed text> | head -c MB`),
reassemble its stdout exactly (TurnOutput) and report their own CPU seconds (user + system,
from the go to their turn's terminal event). Two ways of subscribing, the same workload:
- narrow: `turn.<id>.` (the client adds the low-volume `supervisor.` family) - what both clients
  do now;
- broad: every `turn.` topic - what the Node sidecar did to check the global seq.
Figures: mean CPU seconds per sidecar and wall seconds of the round, by mode and N, and
`cpu_ratio` = per-sidecar CPU at N=many / at N=1 (goal for narrow: about 1, i.e. a sidecar's cost
does not grow with the number of other turns; broad grows about N-fold). Each sidecar also
checks its byte count and counts events of other turns it received (`stray`). With --node the
sidecars are Node processes on contrib/node-sidecar (tests/bench/sidecar_node.mjs; `npm ci` there
first), the client the issue measured.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_daemon import start_daemon, stop_daemon  # noqa: E402

from supervisor.client import Client, TurnOutput  # noqa: E402

LINE = "Grüße, 世界! 😀 some output of a coding agent turn"


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def sidecar(state: str, turn_id: str, mode: str, size: int) -> None:
    """One sidecar process: ready, wait for go, run its turn, print its figures."""
    with Client(Path(state), timeout=30) as client:
        prefixes = [f"turn.{turn_id}."] if mode == "narrow" else ["turn."]
        with client.subscribe(prefixes) as sub:
            print("ready", flush=True)
            sys.stdin.readline()
            start_cpu, start = cpu_seconds(), time.monotonic()
            argv = ["sh", "-c", f"yes '{LINE}' | head -c {size}"]
            client.turn("bench", argv, id=turn_id)
            out, got, stray, events = TurnOutput(turn_id), 0, 0, 0
            while True:
                event = sub.recv(30)
                if event is None:
                    raise SystemExit(f"sidecar {turn_id}: no event for 30 s")
                topic, body = event
                if not topic.startswith(f"turn.{turn_id}."):
                    stray += 1
                    continue
                events += 1
                piece = out.feed(topic, body)
                if piece is not None and piece[0] == "stdout":
                    got += len(piece[1])
                if topic.rsplit(".", 1)[1] in ("released", "cancelled", "rejected"):
                    break
            print(
                json.dumps(
                    {
                        "cpu_s": cpu_seconds() - start_cpu,
                        "wall_s": time.monotonic() - start,
                        "bytes": got,
                        "stray": stray,
                        "events": events,
                        "gaps": sub.gaps,
                    }
                ),
                flush=True,
            )


NODE_SIDECAR = Path(__file__).resolve().parent / "sidecar_node.mjs"


def round_of(state: Path, mode: str, n: int, size: int, tag: str, node: bool) -> dict:
    def command(i: int) -> list[str]:
        turn_id = f"{tag}-{mode}-{n}-{i}"
        if node:
            return ["node", str(NODE_SIDECAR), str(state), turn_id, mode, str(size)]
        return [sys.executable, __file__, "--sidecar", str(state), turn_id, mode]

    procs = [
        subprocess.Popen(
            command(i),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={"BENCH_SIZE": str(size), **__import__("os").environ},
        )
        for i in range(n)
    ]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    start = time.monotonic()
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    results = [json.loads(p.stdout.readline()) for p in procs]
    wall = time.monotonic() - start
    for p in procs:
        p.wait(30)
    assert all(r["bytes"] == size for r in results), results
    return {
        "cpu_s_per_sidecar": round(statistics.mean(r["cpu_s"] for r in results), 3),
        "wall_s": round(wall, 2),
        "stray_events_per_sidecar": round(statistics.mean(r["stray"] for r in results)),
        "own_events_per_sidecar": round(statistics.mean(r.get("events", 0) for r in results)),
        "gaps": sum(r["gaps"] for r in results),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=float, default=20)
    parser.add_argument("--many", type=int, default=10)
    parser.add_argument("--sidecar", nargs=3)
    parser.add_argument("--node", action="store_true", help="Node sidecars (contrib/node-sidecar)")
    args = parser.parse_args()
    if args.sidecar:
        import os

        sidecar(*args.sidecar, int(os.environ["BENCH_SIZE"]))
        return
    size = int(args.mb * 1e6)
    state = Path(tempfile.mkdtemp(prefix="ccsup-bench-", dir="/tmp"))
    state.chmod(0o700)
    daemon = start_daemon(state, f"bench = {args.many}")
    result: dict[str, object] = {
        "bench": "sidecars",
        "client": "node" if args.node else "python",
        "mb_per_turn": args.mb,
    }
    try:
        for mode in ("narrow", "broad"):
            one = round_of(state, mode, 1, size, "r", args.node)
            many = round_of(state, mode, args.many, size, "r", args.node)
            result[mode] = {
                "1": one,
                str(args.many): many,
                "cpu_ratio": round(many["cpu_s_per_sidecar"] / one["cpu_s_per_sidecar"], 2),
            }
    finally:
        stop_daemon(daemon, state)
        shutil.rmtree(state, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
