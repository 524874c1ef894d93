"""One turn streaming a lot of output through `ccsup run`, against the same command run plainly in
the same run; prints one JSON line.

    .venv/bin/python tests/bench/bench_stream.py [--mb 100] [--rounds 3] [--adopt-within 30s]

A supervisor of the tree this file is in (`python -m supervisor`, cap 1), then `ccsup run --key k
-- sh -c 'yes <line> | head -c MB'` with its stdout to /dev/null, --rounds times; the reference
is the same `sh -c` as a plain subprocess, its stdout to /dev/null, timed just before each round.
Figures (medians over the rounds): `run_s` (wall, until `ccsup run` exits with the turn's code),
`plain_s`, `ratio` = run_s / plain_s, `supervisor_cpu_s` (the daemon's own utime + stime over
the rounds, divided by them: what the stream cost its event loop), and `run_cpu_s` (the `ccsup
run` process's). The file is written so that an older tree can run it too (the output
benches within 10 % of before): copy it into that tree's tests/bench/ and run it with its venv;
`--adopt-within` is then left out of the config (an older build has no such key).

Clean-up: the daemon is asked to quit and killed by pid if it does not.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from supervisor.client import Client  # noqa: E402
from supervisor.errors import CcsupError  # noqa: E402

LINE = "Grüße, 世界! 😀 some output of a coding agent turn"


def _cpu(pid: int) -> float:
    """utime + stime of a live process, seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--adopt-within", default=None, help='e.g. "30s"; left out when not given')
    args = parser.parse_args()
    size = args.mb * 1_000_000
    command = ["sh", "-c", f"yes '{LINE}' | head -c {size}"]
    state = Path(tempfile.mkdtemp(prefix="ccsup-bench-stream-"))
    os.chmod(state, 0o700)
    config = state / "ccsup.toml"
    adopt = f'adopt_within = "{args.adopt_within}"\n' if args.adopt_within else ""
    config.write_text(f'[slots]\ncaps = {{ k = 1 }}\n[guard]\ngrace = "1s"\n{adopt}')
    base = [sys.executable, "-m", "supervisor", "--state-dir", str(state), "--config", str(config)]
    daemon = subprocess.Popen(
        [*base, "start", "--foreground"],
        stdout=subprocess.DEVNULL,
        stderr=open(state / "daemon.stderr", "wb"),
        start_new_session=True,
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with Client(state, timeout=1.0) as c:
                    c.status()
                break
            except CcsupError:
                if time.monotonic() > deadline or daemon.poll() is not None:
                    raise SystemExit((state / "daemon.stderr").read_text()[-2000:]) from None
                time.sleep(0.05)
        runs, plains, run_cpus = [], [], []
        cpu_before = _cpu(daemon.pid)
        for _ in range(args.rounds):
            t0 = time.monotonic()
            subprocess.run(command, stdout=subprocess.DEVNULL, check=True)
            plains.append(time.monotonic() - t0)
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.monotonic()
            done = subprocess.run(
                [*base, "run", "--key", "k", "--", *command],
                stdout=subprocess.DEVNULL,
                stdin=subprocess.DEVNULL,
                cwd=ROOT,
            )
            runs.append(time.monotonic() - t0)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            run_cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
            if done.returncode != 0:
                raise SystemExit(f"ccsup run exited {done.returncode}")
        supervisor_cpu = (_cpu(daemon.pid) - cpu_before) / args.rounds
        run_s, plain_s = statistics.median(runs), statistics.median(plains)
        print(
            json.dumps(
                {
                    "bench": "stream",
                    "tree": str(ROOT),
                    "mb": args.mb,
                    "rounds": args.rounds,
                    "run_s": round(run_s, 3),
                    "plain_s": round(plain_s, 3),
                    "ratio": round(run_s / plain_s, 2),
                    "supervisor_cpu_s": round(supervisor_cpu, 3),
                    "run_cpu_s": round(statistics.median(run_cpus), 3),
                    "adopt_within": args.adopt_within,
                }
            )
        )
    finally:
        try:
            with Client(state, timeout=5.0) as c:
                c.quit()
            daemon.wait(30)
        except Exception:
            daemon.kill()
            daemon.wait()
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    main()
