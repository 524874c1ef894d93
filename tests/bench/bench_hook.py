"""The hook's cost before every shell command: the fast form `python -S fast_hook.py claude` fed a
Claude Code payload, as a subprocess.

    .venv/bin/python tests/bench/bench_hook.py [--runs 40]

Prints one JSON line, milliseconds over `--runs` runs each, all measured in this run, the runs
alternating (one of each, then the next round) so that a burst of load falls on all alike:
- `python_ms`: `python -S -c pass`, the interpreter alone (the reference);
- `python_os_ms`: `python -S -c "import os"` (with -S, `os` is not imported before the hook's own);
- `unmatched_ms`: the hook for `git status --short` (no rule's word: the prefilter answers before
  any JSON is parsed; the goal is under 20 ms);
- `parsed_ms`: the hook for `grep -rn make src | head` (a rule's word in it, so the line is read
  by supervisor/agents/shell_line.py, but no rule takes a command: passes untouched);
- `own_ms`: unmatched_ms - python_ms, the hook's own work (`os` included);
each as {"min", "median"}; and `load`, the 1-minute load average at the start.
$CCSUP_BENCH_HOOK names another fast_hook.py (an older checkout's) to compare in the same way.
The bytecode is compiled first (as `ccsup hook install` does); no supervisor is involved (no
command here matches), and $CCSUP_HOOK_LOG points into a temporary directory.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOOK = Path(os.environ.get("CCSUP_BENCH_HOOK") or ROOT / "supervisor" / "agents" / "fast_hook.py")


def payload(command: str) -> bytes:
    return json.dumps(
        {
            "session_id": "bench",
            "cwd": str(ROOT),
            "hook_event_name": "PreToolUse",
            "tool_name": "Bash",
            "tool_input": {"command": command, "description": "bench"},
        }
    ).encode()


def timed(argv: list[str], data: bytes, env: dict) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(argv, input=data, capture_output=True, env=env)
    elapsed = (time.perf_counter() - t0) * 1000
    if done.returncode != 0 or done.stdout:
        raise SystemExit(f"{argv} answered {done.returncode} {done.stdout!r} {done.stderr!r}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()
    compileall.compile_dir(str(HOOK.parent), maxlevels=0, quiet=2)
    with tempfile.TemporaryDirectory(prefix="ccsup-bench-hook-") as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CCSUP_")}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env.update(CCSUP_HOOK_LOG=f"{tmp}/hook.log", XDG_CONFIG_HOME=f"{tmp}/xdg")
        cases = {
            "python_ms": ([sys.executable, "-S", "-c", "pass"], b""),
            "python_os_ms": ([sys.executable, "-S", "-c", "import os"], b""),
            "unmatched_ms": (
                [sys.executable, "-S", str(HOOK), "claude"],
                payload("git status --short"),
            ),
            "parsed_ms": (
                [sys.executable, "-S", str(HOOK), "claude"],
                payload("grep -rn make src | head"),
            ),
        }
        load = os.getloadavg()[0]
        times: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.runs):
            for name, (argv, data) in cases.items():
                times[name].append(timed(argv, data, env))
    result: dict[str, object] = {
        name: {"min": round(min(t), 1), "median": round(statistics.median(t), 1)}
        for name, t in times.items()
    }
    result["own_ms"] = {
        "min": round(min(times["unmatched_ms"]) - min(times["python_ms"]), 1),
        "median": round(
            statistics.median(times["unmatched_ms"]) - statistics.median(times["python_ms"]), 1
        ),
    }
    result["load"] = round(load, 1)
    result["runs"] = args.runs
    print(json.dumps(result))


if __name__ == "__main__":
    main()
