"""`ccsup top`'s own CPU while N turns run (goal under 2 % of a core at 100 turns).

    .venv/bin/python tests/bench/bench_top.py [--turns 100] [--seconds 30] [--churn]

Starts a daemon (its own state directory, cap N), N turns of `sleep` held running, and
`ccsup top` in a tmux pane of 80x24 (a tmux server of its own); after a 3 s warm-up, psutil's
cpu_times of the top process (user + system, its children none) over `--seconds`. `--churn`
also runs one short turn a second on another key (a waiter comes, is granted, ends: the events
top redraws on). Prints one JSON line: `cpu_percent` of one core, `turns`, `seconds`, `churn`,
`top_rss_mib`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_daemon import CCSUP, RUN, start_daemon, stop_daemon, wait_started  # noqa: E402

from supervisor.client import Client  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--churn", action="store_true")
    args = parser.parse_args()
    if shutil.which("tmux") is None:
        raise SystemExit("tmux is not installed")
    state = Path(tempfile.mkdtemp(prefix="ccsup-top-", dir="/tmp"))
    os.chmod(state, 0o700)
    daemon = start_daemon(state, f"hold = {args.turns}, churn = 1")
    server = ["tmux", "-L", f"bench-top-{RUN}"]
    try:
        with Client(state, timeout=30) as client, client.subscribe(["turn."]) as sub:
            for n in range(args.turns):
                client.turn("hold", ["sleep", "600"], id=f"top-{RUN}-{n}")
            wait_started(sub, args.turns)
        env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
        env |= {"TERM": "xterm-256color"}
        command = f"{CCSUP[0]} -m supervisor --state-dir {state} top"
        subprocess.run([*server, "new-session", "-d", "-s", "top", "-x", "80", "-y", "24", command],
                       env=env, check=True)  # fmt: skip
        pane_pid = int(
            subprocess.run([*server, "display", "-p", "-t", "top", "#{pane_pid}"],
                           capture_output=True, text=True, check=True).stdout
        )  # fmt: skip
        pane = psutil.Process(pane_pid)
        top = next(
            (p for p in [pane, *pane.children(recursive=True)] if "top" in p.cmdline()), pane
        )
        time.sleep(3.0)  # warm-up: imports, the first ps, the first samples
        before, started = top.cpu_times(), time.monotonic()
        churned = 0
        with Client(state, timeout=30) as client:
            while time.monotonic() - started < args.seconds:
                if args.churn:
                    client.turn("churn", ["true"], id=f"top-{RUN}-churn-{churned}")
                    churned += 1
                time.sleep(1.0)
        after, elapsed = top.cpu_times(), time.monotonic() - started
        used = (after.user - before.user) + (after.system - before.system)
        screen = subprocess.run([*server, "capture-pane", "-p", "-t", "top"],
                                capture_output=True, text=True).stdout  # fmt: skip
        if f"{args.turns} held" not in screen:
            raise SystemExit(f"top does not show {args.turns} held turns:\n{screen}")
        print(
            json.dumps(
                {
                    "bench": "top",
                    "turns": args.turns,
                    "seconds": round(elapsed, 1),
                    "churn": churned,
                    "cpu_percent": round(used / elapsed * 100, 2),
                    "top_rss_mib": round(top.memory_info().rss / 2**20, 1),
                }
            )
        )
    finally:
        subprocess.run([*server, "kill-server"], capture_output=True)
        stop_daemon(daemon, state)
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    main()
