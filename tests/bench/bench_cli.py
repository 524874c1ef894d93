"""CLI start-up: `ccsup --version`, `ccsup status` and `ccsup ps --json` (100 slots) as subprocesses.

    .venv/bin/python tests/bench/bench_cli.py [--runs 15]

Prints one JSON line of medians in milliseconds over `--runs` runs each, all measured in this run:
- `python_ms`: `python -I -c pass`, the interpreter alone (the floor);
- `zmq_ms`: `python -c "import zmq"`, the floor of any command that talks to the daemon;
- `version_ms`: `ccsup --version` (the installed console script);
- `status_ms`, `ps_ms`: `ccsup --config C --state-dir D status` and `... ps --json` against a real
  daemon with 10 keys x cap 10 = 100 slots, started with `python -m supervisor ... start` (detached)
  in a temporary state directory and stopped with `ccsup stop` afterwards (the goal:
  `ps_ms` < 150).
The runs of each command alternate (a round of every command, then the next round), so that a
burst of load on the shared machine falls on all of them alike. The temporary XDG directories keep
the user's own configuration out of the measurement.

Every command is measured twice, under two keys:
- `nocache`: with the environment as given. Where PYTHONDONTWRITEBYTECODE=1 is set (as in this
  project's sandbox) and ccsup's editable checkout has no __pycache__, every ccsup module is
  compiled from source at every start;
- `cached`: PYTHONDONTWRITEBYTECODE unset and PYTHONPYCACHEPREFIX set to a temporary directory
  (warmed by one run of each command first), as an installed ccsup runs: bytecode for every module
  is read, none compiled. Nothing is written into the checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
CCSUP = str(Path(PYTHON).parent / "ccsup")


def timed(argv: list[str], env: dict) -> tuple[float, bytes]:
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, env=env, cwd=ROOT)
    elapsed = (time.perf_counter() - t0) * 1000
    if done.returncode != 0:
        raise SystemExit(
            f"{' '.join(argv)} exited {done.returncode}: {done.stderr.decode(errors='replace')}"
        )
    return elapsed, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ccb-", dir="/tmp"))
    state = root / "s"
    config = root / "ccsup.toml"
    caps = ", ".join(f"k{i} = 10" for i in range(10))  # 10 keys x 10 slots = 100 slots
    config.write_text(f"[slots]\ncaps = {{ {caps} }}\n")
    env = {
        **os.environ,
        "XDG_CONFIG_HOME": str(root / "config"),
        "XDG_STATE_HOME": str(root / "state"),
    }
    env.pop("CCSUP_CONFIG", None)
    env.pop("CCSUP_STATE_DIR", None)
    cached_env = {**env, "PYTHONPYCACHEPREFIX": str(root / "pycache")}
    cached_env.pop("PYTHONDONTWRITEBYTECODE", None)
    modes = {"nocache": env, "cached": cached_env}
    where = ["--state-dir", str(state), "--config", str(config)]
    commands = {
        "python_ms": [PYTHON, "-I", "-c", "pass"],
        "zmq_ms": [PYTHON, "-c", "import zmq"],
        "version_ms": [CCSUP, "--version"],
        "status_ms": [CCSUP, *where, "status"],
        "ps_ms": [CCSUP, *where, "ps", "--json"],
    }
    try:
        timed([PYTHON, "-m", "supervisor", *where, "start"], env)
        try:
            _, out = timed(commands["ps_ms"], env)
            slots = sum(t["cap"] for t in json.loads(out)["slot_keys"])  # free ones: counted
            if slots != 100:
                raise SystemExit(f"expected 100 slots, ps shows {slots}")
            for argv in commands.values():
                timed(argv, cached_env)  # writes the bytecode the cached runs read
            times = {(mode, name): [] for mode in modes for name in commands}
            for _ in range(args.runs):
                for mode, mode_env in modes.items():
                    for name, argv in commands.items():
                        times[mode, name].append(timed(argv, mode_env)[0])
        finally:
            timed([CCSUP, *where, "stop", "--timeout", "30"], env)
        result: dict = {"bench": "cli", "runs": args.runs, "slots": slots}
        for mode in modes:
            medians = {name: round(statistics.median(times[mode, name]), 1) for name in commands}
            medians["ps_over_zmq_ms"] = round(medians["ps_ms"] - medians["zmq_ms"], 1)
            medians["version_over_python_ms"] = round(
                medians["version_ms"] - medians["python_ms"], 1
            )
            result[mode] = medians
        print(json.dumps(result))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
