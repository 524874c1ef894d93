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
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "helpers"))  # status_poller

from bench_daemon import (  # noqa: E402
    connected_publisher,
    request_turn,
    start_daemon,
    stop_daemon,
    wait_started,
    zygote_of,
)
from status_poller import StatusPoller  # noqa: E402

from supervisor.client import Client  # noqa: E402


def burst(state: Path, n: int, lose_zygote: bool) -> tuple[float, float]:
    """(seconds until all n run, slowest status in ms meanwhile)."""
    proc = start_daemon(state, f"k = {n}")
    try:
        zygote = zygote_of(proc.pid)

        def lose(started: int) -> None:
            if lose_zygote and started == max(1, n // 10):
                os.kill(zygote, signal.SIGKILL)

        with StatusPoller(state) as poller:
            with Client(state, timeout=30) as client, client.subscribe(["turn."]) as sub:
                pub = connected_publisher(client)
                t0 = time.monotonic()
                for _ in range(n):
                    request_turn(pub, uuid.uuid4().hex, "k", ["sleep", "60"])
                wait_started(sub, n, lose)
                took = time.monotonic() - t0
            return took, round(poller.slowest() * 1000, 1)
    finally:
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
