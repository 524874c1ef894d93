"""Cost per turn from 50 to 500 turns, against plain subprocess.Popen in the same run.

    .venv/bin/python tests/bench/bench_scale.py [--sizes 50,100,250,500] [--repeat 1] [--dir /tmp]

--dir: where the state directories go. Each turn creates files (its log directory and logs, its
guard's record) and its stop removes some; on an ext4 without a journal (this machine's) a
creation skips every inode freed in the last 30 s, so each size pays for the removals of the one
before it: `--dir /dev/shm` (tmpfs) shows the cost per turn without that.

For each N: a real daemon with `s = N` (grace 1s), N turns of `sleep 600` requested at once from
one client (`--via bus`, the default: every `request.turn` published on the bus in one burst, as
sidecars send them, from a publisher already connected; `--via control`: one control request
after another, each waiting for its answer); the clock stops when every turn's `started` event has arrived. Then, with all N
running: the supervisor's RSS (VmRSS), the guards' USS (Private_* of /proc/<pid>/smaps_rollup:
median and max over every guard, and the median by kind of mapping from /proc/<pid>/smaps), `ccsup ps --json` as a subprocess (CLI start-up included,
median of 5), and `ccsup stop` as a subprocess (until it returns: every turn ended and confirmed
gone), with `stop_cpu_ms_per_turn`: the CPU the daemon's whole process tree (supervisor, zygote,
guards, turns) used from the stop on, divided by N (each task's schedstat before the stop, the
daemon's wait4 usage after it: a figure less noisy than stop_s on a shared machine). The reference: `subprocess.Popen(["sleep", "600"])` 500 times (N times for each N), timed
in the same run just before, then killed by pid.

Prints one JSON line per N and a last one, `"bench": "scale"`, with the per-turn spread
(max / min over the sizes of each size's median per-turn cost, over `--repeat` runs: goal <= 1.2;
`per_turn_spread_every_run` is max / min over every single run, which on a shared 2-core machine
is mostly the noise of the shortest runs: 50 turns start in ~0.12 s), the 500 ratio (goal <= 10)
and the stop's CPU per turn at each size (flat when the stop costs the same per turn).
`supervisor_cpu_ms_per_turn` is the daemon's own CPU (utime + stime) while the N turns started,
divided by N: less noisy than wall time on a shared machine.
Clean-up: the daemon is stopped by `ccsup stop` (which ends every turn) and killed by pid if that
fails; the Popen reference processes are killed by pid.
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
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench_daemon import connected_publisher, request_turn, run_daemon, wait_started  # noqa: E402

from supervisor.client import Client  # noqa: E402

CCSUP = [sys.executable, "-m", "supervisor"]


def start_daemon(state: Path, cap: int) -> subprocess.Popen:
    config = state / "ccsup.toml"
    config.write_text(f'[slots]\ncaps = {{ s = {cap} }}\n[guard]\ngrace = "1s"\nscan = "2s"\n')
    return run_daemon(state, config)


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def uss_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return sum(int(line.split()[1]) for line in f if line.startswith("Private_"))
    except OSError:
        return None


def private_kib_by_mapping(pid: int) -> dict[str, int]:
    """A process's private memory (KiB) by kind of mapping, from /proc/<pid>/smaps: Python's object
    arenas (anonymous mappings), the malloc heap, libpython's data, the stack, the rest."""
    found = dict.fromkeys(("arenas", "heap", "libpython", "stack", "other"), 0)
    kind = "other"
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                parts = line.split()
                if parts[0].endswith(":"):
                    if parts[0] in ("Private_Clean:", "Private_Dirty:"):
                        found[kind] += int(parts[1])
                    continue
                name = parts[5] if len(parts) > 5 else ""
                kind = {"": "arenas", "[heap]": "heap", "[stack]": "stack"}.get(name, "other")
                kind = "libpython" if "libpython" in name else kind
    except OSError:
        pass
    return found


def cpu_s(pid: int) -> float:
    """utime + stime of pid, seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_s(root: int) -> float:
    """CPU used so far by root and every descendant, seconds: schedstat (ns) of each live task,
    plus the usage of children already reaped (cutime + cstime; ticks)."""
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0]) / 1e9
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            continue  # ended meanwhile: its parent's usage holds it once reaped
    return total


def wait_usage(proc: subprocess.Popen, timeout: float) -> float:
    """Reap proc (killed after timeout) and return the CPU it and its reaped descendants used."""
    deadline = time.monotonic() + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return usage.ru_utime + usage.ru_stime
        if time.monotonic() > deadline:
            proc.kill()
        time.sleep(0.01)


def plain_popen(n: int) -> float:
    t0 = time.monotonic()
    procs = [subprocess.Popen(["sleep", "600"]) for _ in range(n)]
    elapsed = time.monotonic() - t0
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()
    return elapsed


# Turn ids unique to this run: a reaper of another test on the machine ends escapees by their
# CCSUP_TURN marker, so a common id such as `t1` can be ended by someone else's test.
RUN = uuid.uuid4().hex[:8]


def turn_id(i: int) -> str:
    return f"t{RUN}-{i}"


def publish_all(pub, n: int) -> None:
    """Every request at once on the bus, as sidecars send them."""
    for i in range(n):
        request_turn(pub, turn_id(i), "s", ["sleep", "600"])


def one_size(root: Path, n: int, via: str) -> dict:
    state = root / f"n{n}"
    state.mkdir(mode=0o700)
    plain = plain_popen(n)
    proc = start_daemon(state, n)
    stopped = False
    try:
        with Client(state, timeout=30) as client, client.subscribe(["turn.t"]) as sub:
            pub = connected_publisher(client) if via == "bus" else None
            cpu0 = cpu_s(proc.pid)
            t0 = time.monotonic()
            if pub is not None:
                publish_all(pub, n)
            else:
                for i in range(n):
                    client.turn("s", ["sleep", "600"], id=turn_id(i))
            requested = time.monotonic() - t0
            wait_started(sub, n)
            all_running = time.monotonic() - t0
            cpu = cpu_s(proc.pid) - cpu0
        time.sleep(0.5)  # let the last guards settle before measuring memory
        ps_cmd = [*CCSUP, "--state-dir", str(state), "ps", "--json"]
        ps_times, slots = [], []
        for _ in range(5):
            t1 = time.monotonic()
            out = subprocess.run(ps_cmd, capture_output=True, check=True).stdout
            ps_times.append((time.monotonic() - t1) * 1000)
            slots = json.loads(out)["slots"]
        guards = [s["pid"] for s in slots if s["key"] == "s" and s["pid"]]
        uss = sorted(u for u in (uss_kib(p) for p in guards) if u is not None)
        by_mapping = [private_kib_by_mapping(p) for p in guards]
        supervisor_rss = rss_kib(proc.pid)
        stop_cpu0 = tree_cpu_s(proc.pid)
        t2 = time.monotonic()
        subprocess.run([*CCSUP, "--state-dir", str(state), "stop"], capture_output=True, check=True)
        stop_s = time.monotonic() - t2
        stopped = True
        stop_cpu = wait_usage(proc, 30) - stop_cpu0
    finally:
        if not stopped:
            proc.kill()
            proc.wait()
    return {
        "bench": "scale_n",
        "n": n,
        "via": via,
        "plain_popen_s": round(plain, 3),
        "request_s": round(requested, 3),
        "all_running_s": round(all_running, 3),
        "per_turn_ms": round(all_running / n * 1000, 2),
        "ratio_to_popen": round(all_running / plain, 1),
        "supervisor_cpu_ms_per_turn": round(cpu / n * 1000, 2),
        "supervisor_rss_mib": round(supervisor_rss / 1024, 1),
        "guard_uss_mib_median": round(statistics.median(uss) / 1024, 2) if uss else None,
        "guard_uss_mib_max": round(uss[-1] / 1024, 2) if uss else None,
        "guards_measured": len(uss),
        "guard_private_kib_median_by_mapping": {
            kind: statistics.median(m[kind] for m in by_mapping) for kind in by_mapping[0]
        }
        if by_mapping
        else None,
        "ps_ms_median": round(statistics.median(ps_times), 1),
        "stop_s": round(stop_s, 2),
        "stop_cpu_ms_per_turn": round(stop_cpu / n * 1000, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="50,100,250,500")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--via", choices=("bus", "control"), default="bus")
    parser.add_argument("--dir", default="/tmp", help="where the state directories go")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    root = Path(tempfile.mkdtemp(prefix="ccsup-scale-", dir=args.dir))
    try:
        results = []
        for r in range(args.repeat):
            (root / f"r{r}").mkdir()
            for n in sizes:
                result = one_size(root / f"r{r}", n, args.via)
                print(json.dumps(result), flush=True)
                results.append(result)
        per_turn = [
            statistics.median(x["per_turn_ms"] for x in results if x["n"] == n) for n in sizes
        ]
        every_run = [x["per_turn_ms"] for x in results]
        top = max(sizes)
        at_top = [x for x in results if x["n"] == top]
        print(
            json.dumps(
                {
                    "bench": "scale",
                    "sizes": sizes,
                    "per_turn_ms_median": per_turn,
                    "per_turn_spread": round(max(per_turn) / min(per_turn), 2),
                    "per_turn_spread_every_run": round(max(every_run) / min(every_run), 2),
                    "stop_cpu_ms_per_turn": [x["stop_cpu_ms_per_turn"] for x in results],
                    f"all_running_s_{top}": [x["all_running_s"] for x in at_top],
                    f"ratio_to_popen_{top}": [x["ratio_to_popen"] for x in at_top],
                }
            )
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
