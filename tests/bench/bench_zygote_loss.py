"""A guard zygote lost in the middle of a burst, against the same burst without the loss.

    .venv/bin/python tests/bench/bench_zygote_loss.py [--turns 500] [--dir /dev/shm]

N turns of `sleep 60` requested at once at cap N (one daemon each run). In the faulty run the
daemon's zygote is SIGKILLed when the N/10-th turn has started. Prints one JSON line: for each run
the time until all N run (`all_running_s`, `all_running_s_lost`) and the slowest `status` answer
meanwhile, asked every 10 ms by a client in a process of its own (`slowest_status_ms`, `..._lost`).
The requests the lost zygote did not answer go to a new zygote started at once (it had answered
some); they used to be started directly in one go on the event loop (c2f5ba0, 500 turns: 8.5 s
until all ran, `status` unanswered for 8.2 s).
Clean-up: each daemon is stopped by `quit` (which ends every turn), killed by pid if that fails.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bench_daemon import connected_publisher, request_turn, start_daemon, stop_daemon, zygote_of

from supervisor.client import Client

ROOT = Path(__file__).resolve().parents[2]
STATUS_POLLER = """
import select, sys, time
sys.path.insert(0, sys.argv[2])
from supervisor.client import Client
slowest = 0.0
with Client(sys.argv[1], timeout=30) as client:
    while not select.select([sys.stdin], [], [], 0)[0]:
        t0 = time.monotonic()
        client.status()
        slowest = max(slowest, time.monotonic() - t0)
        time.sleep(0.01)
print(round(slowest * 1000, 1))
"""


def burst(state: Path, n: int, lose_zygote: bool) -> tuple[float, float]:
    """(seconds until all n run, slowest status in ms meanwhile)."""
    proc = start_daemon(state, f"k = {n}")
    poller = subprocess.Popen(
        [sys.executable, "-c", STATUS_POLLER, str(state), str(ROOT)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        with Client(state, timeout=30) as client, client.subscribe(["turn."]) as sub:
            pub = connected_publisher(client)
            zygote = zygote_of(proc.pid)
            t0 = time.monotonic()
            for _ in range(n):
                request_turn(pub, uuid.uuid4().hex, "k", ["sleep", "60"])
            started = 0
            while started < n:
                event = sub.recv(60)
                if event is None:
                    raise SystemExit(f"no event for 60 s with {started} of {n} started")
                if event[0].endswith(".started"):
                    started += 1
                    if lose_zygote and started == max(1, n // 10):
                        os.kill(zygote, signal.SIGKILL)
            took = time.monotonic() - t0
        assert poller.stdin is not None and poller.stdout is not None
        poller.stdin.close()
        return took, float(poller.stdout.read())
    finally:
        if poller.poll() is None:
            poller.kill()
            poller.wait()
        stop_daemon(proc, state)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=500)
    parser.add_argument("--dir", default="/tmp")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ccsup-zl-", dir=args.dir))
    try:
        figures = {}
        for lost in (False, True):
            state = root / ("lost" if lost else "plain")
            state.mkdir(mode=0o700)
            took, slowest = burst(state, args.turns, lost)
            suffix = "_lost" if lost else ""
            figures[f"all_running_s{suffix}"] = round(took, 3)
            figures[f"slowest_status_ms{suffix}"] = slowest
        print(json.dumps({"bench": "zygote_loss", "turns": args.turns, **figures}))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
