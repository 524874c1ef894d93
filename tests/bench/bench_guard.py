"""Benchmark the guard: start-to-exit overhead, peak RSS, and the cost of one scan.

    .venv/bin/python tests/bench/bench_guard.py [--runs N]

Prints one JSON line. Every number is measured against a reference taken in the same run:
- `ccsup-guard -- /bin/true` (as guardd.launch.guard_command builds it: `python -I -S -c ...`,
  how the supervisor starts it when it has no zygote, with a record directory) against plain
  subprocess of /bin/true; medians, ratio and overhead in ms; the same guard forked by the guard
  zygote (guardd.zygote, how the supervisor normally starts it: request to exit report,
  `zygote_true_ms`, `zygote_overhead_ms`); also `python -m guardd` (how a person runs it) and bare
  `python -c pass` / `python -I -S -c pass` for scale;
- the guard's peak RSS (VmHWM) while running `sleep`, against a bare `python -c pass`-style
  interpreter sleeping (`python -c 'import time; time.sleep(...)'`);
- a scan over a tree of 50 and of 500 sleeping processes (median of repeats): `scan_N_ms` is the
  guard's steady state (guardd.scan.Scanner, files held from the previous scan), `scan_N_first_ms`
  a first scan (guardd.scan.descendants, everything opened by path).
Goals: overhead < 60 ms, peak RSS < 15 MB, one scan of 500 < 5 ms.
"""

from __future__ import annotations

import json
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from guardd import scan  # noqa: E402
from guardd.launch import guard_command  # noqa: E402
from guardd.zygote_handle import Zygote  # noqa: E402

PY = sys.executable


def timed(argv: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(argv, check=True)
    return time.perf_counter() - t


def timed_fork(zygote: Zygote, args: list[str]) -> float:
    """Request to exit report: a guard forked by the zygote, stdio on /dev/null."""
    null = os.open(os.devnull, os.O_RDWR)
    t = time.perf_counter()
    try:
        spawned = zygote.spawn(args, cwd=None, env=dict(os.environ), stdio=(null, null, null))
    finally:
        os.close(null)
    os.close(spawned.pidfd)
    while True:
        reports = zygote.poll_reports()
        if reports:
            elapsed = time.perf_counter() - t
            assert reports == [(spawned.pid, 0)], reports
            return elapsed
        if not zygote.alive:
            raise SystemExit("the zygote died")
        select.select([zygote.fileno()], [], [], 5)


def start_to_exit(runs: int) -> dict:
    zygote = Zygote.start()
    try:
        with tempfile.TemporaryDirectory(prefix="ccsup-bench-") as d:
            args = ["--record-dir", d, "--", "/bin/true"]
            guard = guard_command(args)
            module = [PY, "-m", "guardd", *args]
            plain, guarded, by_module, forked = [], [], [], []
            for _ in range(runs):  # interleaved, so machine noise hits all alike
                plain.append(timed(["/bin/true"]))
                guarded.append(timed(guard))
                by_module.append(timed(module))
                forked.append(timed_fork(zygote, args))
            bare = [timed([PY, "-c", "pass"]) for _ in range(runs)]
            bare_s = [timed([PY, "-I", "-S", "-c", "pass"]) for _ in range(runs)]
    finally:
        zygote.close()
    p, g, m, b, bs, z = (
        statistics.median(x) * 1000 for x in (plain, guarded, by_module, bare, bare_s, forked)
    )
    return {
        "plain_true_ms": round(p, 2),
        "guard_true_ms": round(g, 2),
        "guard_module_true_ms": round(m, 2),
        "python_pass_ms": round(b, 2),
        "python_IS_pass_ms": round(bs, 2),
        "ratio": round(g / p, 1),
        "overhead_ms": round(g - p, 2),
        "zygote_true_ms": round(z, 2),
        "zygote_overhead_ms": round(z - p, 2),
    }


def vm_hwm_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmHWM for {pid}")


def peak_rss() -> dict:
    guard = subprocess.Popen(guard_command(["--scan", "0.05", "--", "sleep", "1"]))
    ref = subprocess.Popen([PY, "-c", "import time; time.sleep(1)"])
    time.sleep(0.6)  # several scans have run
    g, r = vm_hwm_kb(guard.pid), vm_hwm_kb(ref.pid)
    guard.wait()
    ref.wait()
    return {"guard_peak_rss_mb": round(g / 1024, 2), "python_sleep_peak_rss_mb": round(r / 1024, 2)}


def make_tree(n: int) -> subprocess.Popen:
    """A process that forks n sleeping descendants: a chain of shallow fans (depth 2)."""
    code = (
        "import os, sys, signal\n"
        f"n = {n}; fan = 10\n"
        "made = 0\n"
        "while made < n:\n"
        "    k = min(fan, n - made)\n"
        "    if os.fork() == 0:\n"
        "        for _ in range(k - 1):\n"
        "            if os.fork() == 0:\n"
        "                signal.pause()\n"
        "        signal.pause()\n"
        "    made += k\n"
        "os.write(1, b'ready\\n')\n"
        "signal.pause()\n"
    )
    p = subprocess.Popen([PY, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
    assert p.stdout.readline() == b"ready\n"
    return p


def scan_cost(n: int, repeats: int = 50) -> dict:
    p = make_tree(n)
    try:
        deadline = time.monotonic() + 10
        while len(scan.descendants(p.pid)) < n and time.monotonic() < deadline:
            time.sleep(0.01)
        found = len(scan.descendants(p.pid))
        cold, warm = [], []
        scanner = scan.Scanner(p.pid)  # what the guard runs: each scan after the first re-reads
        scanner.descendants()
        for _ in range(repeats):  # interleaved, so machine noise hits both alike
            t = time.perf_counter()
            scan.descendants(p.pid)
            cold.append(time.perf_counter() - t)
            t = time.perf_counter()
            scanner.descendants()
            warm.append(time.perf_counter() - t)
        scanner.close()
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        p.stdout.close()
    return {
        f"scan_{n}_found": found,
        f"scan_{n}_ms": round(statistics.median(warm) * 1000, 3),
        f"scan_{n}_first_ms": round(statistics.median(cold) * 1000, 3),
    }


def main() -> None:
    runs = int(sys.argv[sys.argv.index("--runs") + 1]) if "--runs" in sys.argv else 30
    result = {"bench": "guard", "runs": runs}
    result.update(start_to_exit(runs))
    result.update(peak_rss())
    result.update(scan_cost(50))
    result.update(scan_cost(500))
    result["goals_met"] = (
        result["overhead_ms"] < 60
        and result["guard_peak_rss_mb"] < 15
        and result["scan_500_ms"] < 5
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
