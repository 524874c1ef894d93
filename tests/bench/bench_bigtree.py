"""A big turn cancelled while it forks: release time and status latency against the tree's size.

    .venv/bin/python tests/bench/bench_bigtree.py [--sizes 100,400,1000] [--grace 1s] [--cgroup off]

For each size N, a fresh supervisor runs tests/bigtree.py N (3 processes and 2 leaderless groups
per subtree), cancels it when 90 % of the subtrees have started, and prints one JSON line:
`release_after_cancel_s` (cancel answered -> `released` event; goal: <= grace + 1 s),
`status_max_ms` (the slowest `status` answer, asked every 10 ms by a client in a process of its
own, from the turn's request to its release; goal: < 100 ms),
`processes_at_cancel`, `groups_at_cancel`, `left_running` (must be 0). The reference in the same
run is the grace itself: a turn whose work all ends on SIGTERM costs no more than the checks.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "helpers"))

from bench_daemon import run_daemon, stop_daemon  # noqa: E402
from bigtree import cancel_while_forking  # noqa: E402


def start_daemon(state: Path, grace: str, cgroup: str = "auto") -> subprocess.Popen:
    config = state / "ccsup.toml"
    config.write_text(
        f'[slots]\ncaps = {{ big = 1 }}\n[guard]\ngrace = "{grace}"\nscan = "2s"\n'
        f'cgroup = "{cgroup}"\n'
    )
    return run_daemon(state, config, wait=15)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="100,400,1000")
    parser.add_argument("--grace", default="1s")
    parser.add_argument("--cgroup", default="auto", help='[guard] cgroup: "auto" or "off"')
    args = parser.parse_args()
    for size in [int(s) for s in args.sizes.split(",")]:
        state = Path(tempfile.mkdtemp(prefix="ccsup-bb-", dir="/tmp"))
        proc = start_daemon(state, args.grace, args.cgroup)
        try:
            result = cancel_while_forking(state, size, int(size * 0.9))
        finally:
            stop_daemon(proc, state)
            shutil.rmtree(state, ignore_errors=True)
        line = {"bench": "bigtree", "grace": args.grace, "cgroup": args.cgroup, **result}
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
