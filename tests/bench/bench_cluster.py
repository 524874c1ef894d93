"""The cost of a cluster cap: N short turns at cap 2, machine-local against the same cap in etcd.

    .venv/bin/python tests/bench/bench_cluster.py [--turns 100] [--rounds 3]

Starts a 3-member etcd on 127.0.0.1 (Debian's etcd-server, as the tests find it), then, in this
run, each workload `--rounds` times (alternating, the median kept):
- `local_s`: one supervisor, `[slots] caps = { codex = 2 }`, no [cluster] (the reference);
- `cluster_one_s`: one supervisor whose codex is also a cluster key of cap 2;
- `cluster_two_s`: two supervisors (two machines) sharing the cluster cap of 2, half the turns each.
Every turn is `true`; the time is from the first request to the last `released` event.
Prints one JSON line; `overhead_per_turn_ms` is (cluster_two_s - local_s) / turns.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "helpers"))

from etcd_cluster import EtcdCluster, etcd_binary  # noqa: E402

from supervisor.client import Client  # noqa: E402
from supervisor.errors import CcsupError  # noqa: E402

PYTHON = sys.executable


def start(state: Path, config: str) -> subprocess.Popen:
    state.mkdir(mode=0o700)
    (state / "ccsup.toml").write_text(config)
    command = [PYTHON, "-m", "supervisor", "--state-dir", str(state)]
    command += ["--config", str(state / "ccsup.toml"), "start", "--foreground"]
    proc = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=open(state / "err", "wb"), cwd=ROOT
    )
    deadline = time.monotonic() + 20
    while True:
        try:
            with Client(state, timeout=1.0) as c:
                status = c.status()
            if "cluster" not in status or status["cluster"].get("connected"):
                return proc
        except CcsupError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit(f"supervisor in {state} did not start: {(state / 'err').read_text()}")
        time.sleep(0.05)


def stop(state: Path, proc: subprocess.Popen) -> None:
    with Client(state, timeout=5.0) as c:
        c.quit()
    proc.wait(30)


def run(states: list[Path], turns: int) -> float:
    clients = [Client(s, timeout=10.0) for s in states]
    subs = [c.subscribe(["turn."]) for c in clients]
    t0 = time.perf_counter()
    for i in range(turns):
        clients[i % len(clients)].turn("codex", ["true"], id=f"b{uuid.uuid4().hex[:10]}")
    done = 0
    while done < turns:
        for sub in subs:
            event = sub.recv(0.01)
            if event is not None and event[0].endswith(".released"):
                done += 1
    elapsed = time.perf_counter() - t0
    for sub in subs:
        sub.close()
    for c in clients:
        c.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    binary = etcd_binary()
    if binary is None:
        raise SystemExit("no etcd binary: run .ci/run once or set CCSUP_ETCD_BIN")
    root = Path(tempfile.mkdtemp(prefix="ccb-etcd-", dir="/tmp"))
    etcd = EtcdCluster(binary, root / "etcd-data")
    (root / "etcd-data").mkdir()
    base = '[slots]\ncaps = { codex = 2 }\n[guard]\ngrace = "300ms"\nscan = "200ms"\n'
    endpoints = json.dumps(etcd.endpoints)
    results: dict[str, list[float]] = {"local_s": [], "cluster_one_s": [], "cluster_two_s": []}
    try:
        etcd.start()
        for round_ in range(args.rounds):
            for name, machines in (("local_s", 0), ("cluster_one_s", 1), ("cluster_two_s", 2)):
                prefix = f"/b{round_}{name[:9]}"
                states, procs = [], []
                for m in range(max(machines, 1)):
                    state = root / f"{name}-{round_}-{m}"
                    config = base
                    if machines:
                        config += (
                            f'[cluster]\netcd = {endpoints}\nname = "m{m}"\nlease_ttl = "3s"\n'
                            f'prefix = "{prefix}"\ncaps = {{ codex = 2 }}\n'
                        )
                    procs.append(start(state, config))
                    states.append(state)
                try:
                    results[name].append(run(states, args.turns))
                finally:
                    for state, proc in zip(states, procs, strict=True):
                        stop(state, proc)
    finally:
        etcd.close()
        shutil.rmtree(root, ignore_errors=True)
    medians = {k: round(statistics.median(v), 3) for k, v in results.items()}
    overhead = (medians["cluster_two_s"] - medians["local_s"]) / args.turns * 1000
    print(
        json.dumps(
            {
                "bench": "cluster",
                "turns": args.turns,
                **medians,
                "overhead_per_turn_ms": round(overhead, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
