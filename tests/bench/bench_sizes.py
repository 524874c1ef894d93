"""`ps` and `status` at sizes that once broke them, against small ones in
the same run.

    .venv/bin/python tests/bench/bench_sizes.py [--waiters 10000] [--cap 1000000] [--runs 5]

Prints one JSON line:
- waiters (B6): a daemon with key `one = 1`, one `sleep 600` holding it and W waiters behind it
  (each with session and agent labels, asked on the control socket one after another), then a
  100-waiter daemon the same way. For each: `ps_ms` (Client.ps(), the reply received and
  decoded, median of --runs), `ps_bytes` (the JSON `ccsup ps --json` prints), `ps_cli_ms`
  (`ccsup ps --json` as a subprocess, CLI start-up included, median), and `status_ms` (median)
  in the same daemon. `ps_ms_per_waiter_ratio` = (ps_ms at W / W) / (ps_ms at 100 / 100):
  about 1 when `ps` costs the same per waiter at both sizes. A `ps` refused (once, over 1 MiB: about 2,500
  such waiters) is said in `ps_error`.
- cap (B9): `status_ms` and `ps_ms` (medians) with caps `c = 10` and `c = CAP`, three turns of
  `sleep 600` running on `c` in each, and `start_s` (from `ccsup start` to `status` answering).
  `cap_status_ratio` = status_ms at CAP / at 10 (goal: about 1). A daemon that does not answer
  within --wait seconds is reported as `start_s: null` with its error, a call that gets no answer
  within 60 s as `status_error` / `ps_error`. `--caps-only`: the cap part alone.

Clean-up: each daemon is asked to quit (its turns end) and killed by pid if it does not.
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_daemon import CCSUP, RUN, stop_daemon  # noqa: E402

from supervisor.client import Client  # noqa: E402
from supervisor.errors import CcsupError  # noqa: E402
from supervisor.wire import protocol  # noqa: E402


def start(state: Path, caps: str, wait: float) -> tuple[subprocess.Popen, float | None]:
    """`ccsup start --foreground`; (proc, seconds until `status` answered, or None)."""
    config = state / "ccsup.toml"
    config.write_text(f'[slots]\ncaps = {{ {caps} }}\n[guard]\ngrace = "1s"\nscan = "2s"\n')
    with open(state / "daemon.err", "wb") as err:
        proc = subprocess.Popen(
            [*CCSUP, "--state-dir", str(state), "--config", str(config), "start", "--foreground"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
    t0 = time.monotonic()
    while time.monotonic() - t0 < wait and proc.poll() is None:
        try:
            with Client(state, timeout=1) as c:
                c.status()
            return proc, time.monotonic() - t0
        except CcsupError:
            time.sleep(0.05)
    return proc, None


def median_ms(call, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1000)
    return round(statistics.median(times), 2)


def with_waiters(root: Path, n: int, runs: int) -> dict:
    state = root / f"w{n}"
    state.mkdir(mode=0o700)
    proc, _ = start(state, "one = 1", 30)
    out: dict = {"waiters": n}
    try:
        with Client(state, timeout=60) as c:
            c.turn("one", ["sleep", "600"], id=f"busy-{RUN}")
            t0 = time.monotonic()
            for i in range(n):  # control requests, each answered: none can be dropped
                holder = {"session": f"session-{i}", "agent": "bench"}
                c.turn("one", ["true"], id=f"w{i}-{RUN}", holder=holder)
            out["ask_ms_per_waiter"] = round((time.monotonic() - t0) * 1000 / n, 3)
            assert c.status()["waits"] == n
            try:
                out["ps_ms"] = median_ms(c.ps, runs)
            except CcsupError as e:
                out["ps_error"] = e.message
            out["status_ms"] = median_ms(c.status, runs)
        ps_cli = [*CCSUP, "--state-dir", str(state), "ps", "--json"]
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            done = subprocess.run(ps_cli, capture_output=True, timeout=120)
            times.append((time.perf_counter() - t0) * 1000)
        if done.returncode == 0:
            out["ps_bytes"] = len(done.stdout)
            out["ps_cli_ms"] = round(statistics.median(times), 2)
            assert len(json.loads(done.stdout)["waits"]) == n
        else:
            out["ps_cli_error"] = done.stderr.decode().strip()[-300:]
    finally:
        stop_daemon(proc, state)
    return out


def with_cap(root: Path, cap: int, runs: int, wait: float) -> dict:
    state = root / f"c{cap}"
    state.mkdir(mode=0o700)
    proc, start_s = start(state, f"c = {cap}", wait)
    out: dict = {"cap": cap, "start_s": None if start_s is None else round(start_s, 3)}
    try:
        if start_s is None:
            out["error"] = (state / "daemon.err").read_text()[-300:] or "no answer"
            return out
        with Client(state, timeout=60) as c:
            for i in range(3):
                c.turn("c", ["sleep", "600"], id=f"c{i}-{RUN}")
            deadline = time.monotonic() + 60
            while c.status()["turns"] < 3:
                if time.monotonic() > deadline:
                    raise SystemExit("three turns were not granted within 60 s")
                time.sleep(0.05)
            for name, call in (("status", c.status), ("ps", c.ps)):
                try:
                    out[f"{name}_ms"] = median_ms(call, runs)
                except CcsupError as e:  # once: no answer within the client's 60 s
                    out[f"{name}_error"] = e.message
            if "ps_ms" in out:
                out["ps_bytes"] = len(protocol.dumps(c.ps()))
    finally:
        stop_daemon(proc, state)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--waiters", type=int, default=10_000)
    parser.add_argument("--cap", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--caps-only", action="store_true", help="only the cap part")
    parser.add_argument(
        "--wait", type=float, default=30.0, help="seconds a daemon may take to start"
    )
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ccsup-bs-", dir="/tmp"))
    try:
        big = {} if args.caps_only else with_waiters(root, args.waiters, args.runs)
        small = {} if args.caps_only else with_waiters(root, 100, args.runs)
        cap_small = with_cap(root, 10, args.runs, args.wait)
        cap_big = with_cap(root, args.cap, args.runs, args.wait)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result: dict = {"bench": "sizes", "ps_big": big, "ps_small": small}
    result |= {"cap_small": cap_small, "cap_big": cap_big}
    if "ps_ms" in big and "ps_ms" in small:
        per_big, per_small = big["ps_ms"] / big["waiters"], small["ps_ms"] / small["waiters"]
        result["ps_ms_per_waiter_ratio"] = round(per_big / per_small, 2)
    if "status_ms" in cap_big and "status_ms" in cap_small:
        result["cap_status_ratio"] = round(cap_big["status_ms"] / cap_small["status_ms"], 2)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
