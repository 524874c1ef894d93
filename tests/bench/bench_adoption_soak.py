"""The adoption soak, long: the supervisor SIGKILLed at random moments for 5 minutes and started
again each time (the driver is tests/helpers/adoption_soak.py).

    .venv/bin/python tests/bench/bench_adoption_soak.py [--seconds 300] [--seed N] [--cap 3]
        [--workers 6] [--dir /tmp] [--keep]
    BENCH_SOAK_SECONDS=120 .venv/bin/python tests/bench/bench_adoption_soak.py

Prints one JSON line: the counts are the result (no reference run: a count that is not zero is
a bug, however fast). turns_asked/finished/lost, turns_run_twice, grants_seen_twice,
log_/client_bytes_lost/repeated, most_turns_at_once against cap, kills and longest_gap_s (from a
SIGKILL to the next supervisor's status answer, its random 0-1.5 s wait included), and what
explains them: outcomes, ended_by_restart (a turn a supervisor's death cut short), cli exit codes.
The seed is printed in the line; `--seed` replays the same kill moments (not the same machine).
Clean-up: the last supervisor is stopped by `quit`; every process it started is ended by pid.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "helpers"))

from adoption_soak import run_soak  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--seconds", type=float, default=float(os.environ.get("BENCH_SOAK_SECONDS", "300"))
    )
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--cap", type=int, default=3)
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--dir", default="/tmp")
    parser.add_argument("--keep", action="store_true", help="keep the state directory (named)")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    print(f"seed {seed}", file=sys.stderr, flush=True)
    state = Path(tempfile.mkdtemp(prefix="ccsup-as-", dir=args.dir))
    os.chmod(state, 0o700)
    try:
        counts = run_soak(
            state,
            seconds=args.seconds,
            seed=seed,
            cap=args.cap,
            workers=args.workers,
            say=lambda line: print(line, file=sys.stderr, flush=True),
        )
        counts.pop("supervisor_pids")
        print(json.dumps({"bench": "adoption_soak", **counts}))
    finally:
        if args.keep:
            print(f"kept {state}", file=sys.stderr)
        else:
            shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    main()
