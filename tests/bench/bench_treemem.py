"""What sampling a turn's tree memory costs (guardd.treemem), at a 2,000-process tree and at 100
running turns, against the scan the guard makes anyway, in the same run.

    .venv/bin/python tests/bench/bench_treemem.py [--tree 2000] [--turns 100] [--scans 20]

Tree: this process becomes a child subreaper (as a guard is) over tests/helpers/bigtree.py
(3 processes a subtree, every sleep reparented to it), then scans its descendants `--scans`
times as a guard does (guardd.scan.Scanner) — the reference — and then scans and samples
(TreeMemory.sample) as many times. Turns: `--turns` trees of one `sleep` each, every one scanned
(reference) then scanned and sampled, as 100 guards each do once a scan. The supervisor's side:
the room's refresh reading `mem` from that many guard records (supervisor.admission.room), against
the `ps` reading of the same records it already does (containment.add_usage's reader).

One JSON line each: CPU ms per scan (process time: user + system) of the reference and of the
sampling alone, the first sample apart (every process new: its smaps_rollup reads are bounded by
PSS_BUDGET), and `core_pct_at_2s`: the sampling's steady share of one core at the default 2 s scan
(goal: < 1).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from guardd import linux, record, scan  # noqa: E402
from guardd.treemem import TreeMemory  # noqa: E402
from supervisor.admission.room import _read_using  # noqa: E402
from supervisor.guards.containment import usage_so_far  # noqa: E402

SCAN = 2.0


def _cpu() -> float:
    return time.process_time()


def _per_scan(scans: int, step) -> float:
    """CPU ms per call of step(), over `scans` calls."""
    start = _cpu()
    for _ in range(scans):
        step()
    return (_cpu() - start) * 1000 / scans


def bench_tree(subtrees: int, scans: int) -> dict:
    linux.register_subreaper()
    tree = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "helpers" / "bigtree.py"), str(subtrees), "600"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert tree.stdout is not None
        for line in tree.stdout:
            if line.strip() == "done":
                break
        scanner = scan.Scanner(os.getpid())
        found = scanner.descendants()
        reference = _per_scan(scans, scanner.descendants)
        memory = TreeMemory()
        t0 = _cpu()
        memory.sample(found)
        first = (_cpu() - t0) * 1000
        # While PSS is still being read (PSS_BUDGET a sample), then once every process has it.
        refining = _per_scan(scans, lambda: memory.sample(scanner.descendants())) - reference
        samples = 1 + scans
        while _unread(memory, scanner.descendants()) and samples < 300:
            memory.sample(scanner.descendants())
            samples += 1
        refined = _per_scan(scans, lambda: memory.sample(scanner.descendants())) - reference
        return {
            "bench": "treemem_tree",
            "processes": len(found),
            "scan_ms": round(reference, 3),
            "first_sample_ms": round(first, 3),
            "refining_sample_ms": round(refining, 3),
            "samples_to_refine": samples,
            "unread_left": _unread(memory, scanner.descendants()),
            "sample_ms": round(refined, 3),
            "tree_mem_bytes": memory.now,
            "refining_core_pct_at_2s": round(refining / (SCAN * 1000) * 100, 3),
            "core_pct_at_2s": round(refined / (SCAN * 1000) * 100, 3),
        }
    finally:
        _end(tree)


def _unread(memory: TreeMemory, found: dict) -> int:
    """Live processes whose PSS has not been read yet."""
    return sum(
        1 for pid, e in memory._known.items() if e[2] < 0 and pid in found and not found[pid].zombie
    )


def bench_turns(turns: int, scans: int) -> dict:
    sleeps = [subprocess.Popen(["sleep", "600"]) for _ in range(turns)]
    try:
        # One tree per turn: each sleep is the tree of a guard whose root is the sleep's parent;
        # scanning from this process would see them all at once, so each "guard" is a Scanner of
        # its own over a one-process tree, read as a guard reads it.
        found = [{p.pid: scan._stat(p.pid)} for p in sleeps]
        memories = [TreeMemory() for _ in sleeps]
        for memory, tree in zip(memories, found, strict=True):
            memory.sample(tree)  # first sight: one smaps_rollup each

        def reference() -> None:
            for tree in found:
                for pid in tree:
                    tree[pid] = scan._stat(pid)

        def sampled() -> None:
            reference()
            for memory, tree in zip(memories, found, strict=True):
                memory.sample(tree)

        ref = _per_scan(scans, reference)
        sampling = _per_scan(scans, sampled) - ref
        # The supervisor: `mem` read from as many guard records, against reading them for ps.
        with tempfile.TemporaryDirectory(prefix="ccsup-tm-") as tmp:
            paths = {}
            for i, proc in enumerate(sleeps):
                path = Path(tmp) / f"{proc.pid}-{i}.json"
                record.write_json(path, _record(proc.pid, i), sync=False)
                paths[f"t{i}"] = path
            ps_read = _per_scan(scans, lambda: [usage_so_far(p) for p in paths.values()])
            refresh = _per_scan(scans, lambda: _read_using(paths))
        return {
            "bench": "treemem_turns",
            "turns": turns,
            "guards_scan_ms": round(ref, 3),
            "guards_sample_ms": round(sampling, 3),
            "guards_core_pct_at_2s": round(sampling / (SCAN * 1000) * 100, 3),
            "supervisor_ps_read_ms": round(ps_read, 3),
            "supervisor_refresh_ms": round(refresh, 3),
            "supervisor_core_pct_at_1s_refresh": round(refresh / 1000 * 100, 3),
        }
    finally:
        for proc in sleeps:
            _end(proc)


def _record(pid: int, i: int) -> dict:
    """A guard record as a running turn's guard writes it (guardd.guard.Guard.to_record)."""
    return {
        "v": 1,
        "guard": {"pid": pid, "start": 1},
        "turn": f"t{i}",
        "argv": ["sleep", "600"],
        "cwd": "/tmp",
        "own_group": {"pgid": pid, "leader_start": 1},
        "groups": [],
        "state": "running",
        "exit": None,
        "reason": None,
        "started_at": time.time(),
        "cgroup": None,
        "usage": {
            "cpu_user_s": 0.0,
            "cpu_system_s": 0.0,
            "peak_rss_bytes": 1 << 20,
            "processes": 1,
            "mem": 1 << 20,
            "peak_mem": 1 << 20,
        },
    }


def _end(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait()


def _reap_all() -> None:
    """The tree's sleeps were reparented to this subreaper: reap them once they are killed."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tree", type=int, default=2000, help="processes in the big tree")
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--scans", type=int, default=20)
    args = parser.parse_args()
    if args.turns:
        print(json.dumps(bench_turns(args.turns, args.scans)), flush=True)
    try:
        print(json.dumps(bench_tree(max(1, args.tree // 3), args.scans)), flush=True)
    finally:
        for pid in scan.descendants(os.getpid()):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        _reap_all()


if __name__ == "__main__":
    main()
