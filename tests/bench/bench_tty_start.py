"""What `ccsup run -t` adds to a turn's start.

    .venv/bin/python tests/bench/bench_tty_start.py [--n 30]

A real daemon (cap 1); `ccsup run [-i|-t] -- sh -c 'echo ready'` is run n times each way, the
ways interleaved, each with a pty as its stdin, stdout and stderr (as from a terminal: "plain",
without a flag, gives the turn /dev/null; -i forwards the terminal as a pipe, with the stdin
forwarder's own client, as -t does). Timed: from the spawn of `ccsup run` to the first byte
of "ready" on the pty (the whole start: the CLI's imports, the request, the grant, the guard's
start, CMD's output back), and the supervisor's own part, `started` minus `granted` in the
turn's events (the guard's start: a pty and the fork path with -t, pipes and the C clone
without). Prints one JSON line: medians in ms of both, each way, and the differences.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_daemon import CCSUP, start_daemon, stop_daemon  # noqa: E402

from supervisor.history import db as history  # noqa: E402

FLAGS = {"plain": [], "pipe": ["-i"], "tty": ["-t"]}


def one(state: Path, way: str) -> tuple[float, str]:
    """Seconds from spawning `ccsup run` to CMD's first output on the pty; the turn id."""
    master, slave = os.openpty()
    env = {**os.environ, "CCSUP_STATE_DIR": str(state)}
    flags = FLAGS[way]
    started = time.perf_counter()
    proc = subprocess.Popen(
        [*CCSUP, "run", "--json", *flags, "--", "sh", "-c", "echo ready"],
        env=env,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
    )
    os.close(slave)
    out = b""
    first = None
    while True:
        ready, _, _ = select.select([master], [], [], 10)
        if not ready:
            raise RuntimeError(f"no output: {out!r}")
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
        if first is None and b"ready" in out:
            first = time.perf_counter() - started
    proc.wait(30)
    os.close(master)
    turn_id = json.loads(out.split(b"\r\n", 1)[0])["body"]["id"]
    assert first is not None, out
    return first, turn_id


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=30)
    n = parser.parse_args().n
    state = Path(tempfile.mkdtemp(prefix="ccsup-bench-tty-"))
    daemon = start_daemon(state, "default = 1")
    try:
        walls: dict[str, list[float]] = {way: [] for way in FLAGS}
        ids: dict[str, list[str]] = {way: [] for way in FLAGS}
        for i in range(n):
            ways = list(FLAGS)
            for way in ways[i % 3 :] + ways[: i % 3]:
                wall, turn_id = one(state, way)
                walls[way].append(wall)
                ids[way].append(turn_id)
        time.sleep(1)  # the history's writer batches
        guard_ms: dict[str, float] = {}
        for way, turn_ids in ids.items():
            spans = []
            for turn_id in turn_ids:
                story = history.show(state, turn_id)
                assert story is not None
                when = {e["kind"]: e["ts"] for e in story["events"]}
                spans.append(when["started"] - when["granted"])
            guard_ms[way] = statistics.median(spans) * 1000
        wall_ms = {way: statistics.median(v) * 1000 for way, v in walls.items()}
        print(
            json.dumps(
                {
                    "bench": "tty_start",
                    "n": n,
                    "wall_ms_median": {k: round(v, 1) for k, v in wall_ms.items()},
                    "guard_start_ms_median": {k: round(v, 2) for k, v in guard_ms.items()},
                    "tty_adds_wall_ms": round(wall_ms["tty"] - wall_ms["plain"], 1),
                    "tty_adds_guard_start_ms": round(guard_ms["tty"] - guard_ms["plain"], 2),
                    "tty_over_pipe_wall_ms": round(wall_ms["tty"] - wall_ms["pipe"], 1),
                }
            )
        )
    finally:
        stop_daemon(daemon, state)
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    main()
