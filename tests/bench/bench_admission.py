"""What admission costs, against the same work without it in the same run.

    .venv/bin/python tests/bench/bench_admission.py [--turns 200] [--cap 4]

Prints one JSON line:
- `policy_us_limited` / `policy_us_plain`: one grant decision (pause check, rate window check,
  grant counted) for a key with a rate and a pause on its harness, and for a key with neither,
  in microseconds (pure, in process).
- `with_s` / `without_s`: wall time of N turns of `true` at cap C through a real daemon with
  admission configured on the key (a rate that never binds, fairness = "session", a runtime limit
  and a pause_on stderr rule) and without, the median of --rounds runs each, interleaved (on a
  shared machine a burst of load then falls on both); `ratio` = with_s / without_s.
- `rate_max_in_window`, `rate_wall_s`: 15 turns under a rate of 5/1s: the most grants in any 1 s
  (must be <= 5) and the wall time (ideal: a little over 2 s).
- `resume_to_grant_ms`: from `key.<key>.resumed` (a pause expiring) to the head's `granted`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_daemon import run_daemon, stop_daemon  # noqa: E402

from supervisor.admission.pauses import PauseBook  # noqa: E402
from supervisor.admission.policy import Admission  # noqa: E402
from supervisor.admission.rates import RateTable, StartWindows  # noqa: E402
from supervisor.client import Client  # noqa: E402
from supervisor.config.admission import Rate  # noqa: E402

ADMISSION = """
rates = { bench = "100000/s", slow = "5/1s" }
max_runtime = { bench = "1h" }
fairness = "session"
[pause_on.bench]
stderr = "(?i)rate.?limit|429"
"""


def policy_us(limited: bool, n: int = 100_000) -> float:
    admission = Admission(PauseBook(), StartWindows(RateTable({"k:v": Rate(n * 10, 60.0)})))
    key = "k:v" if limited else "other"
    if limited:
        admission.pauses.pause("k", 1.0, 0.0)  # the harness's pause, already over at now=2
    t0 = time.perf_counter()
    for i in range(n):
        now = 2.0 + i * 1e-6
        if admission.hold(key, now) is None:
            admission.granted(key, now)
    return (time.perf_counter() - t0) / n * 1e6


def start_daemon_config(state: Path):
    return run_daemon(state, state / "ccsup.toml")


def write_config(state: Path, caps: str, admission: str) -> None:
    slots, extra = admission.split("[pause_on", 1) if "[pause_on" in admission else (admission, "")
    text = f'[slots]\ncaps = {{ {caps} }}\n{slots}\n[guard]\ngrace = "1s"\nscan = "2s"\n'
    if extra:
        text += "[pause_on" + extra
    (state / "ccsup.toml").write_text(text)


def run_turns(state: Path, key: str, turns: int, holder_of=lambda i: None) -> dict[str, list]:
    """Request N turns of `true` at once; returns {event kind: [(id, ts)]} once all ended."""
    seen: dict[str, list] = {}
    with Client(state, timeout=10) as client, client.subscribe(["turn.", "key."]) as sub:
        for i in range(turns):
            holder = holder_of(i)
            client.turn(key, ["true"], id=f"{key}{i}", **({"holder": holder} if holder else {}))
        done = 0
        while done < turns:
            event = sub.recv(60)
            if event is None:
                raise SystemExit("no event for 60 s")
            topic, body = event
            seen.setdefault(topic.rsplit(".", 1)[-1], []).append((body.get("id"), body["ts"]))
            if topic.endswith((".released", ".cancelled", ".rejected")):
                done += 1
    return seen


def through(state: Path, turns: int, cap: int, admission: str) -> float:
    write_config(state, f"bench = {cap}", admission)
    proc = start_daemon_config(state)
    try:
        t0 = time.monotonic()
        run_turns(state, "bench", turns, lambda i: {"session": f"s{i % 3}"})
        return time.monotonic() - t0
    finally:
        stop_daemon(proc, state)


def rate_run(state: Path) -> tuple[int, float]:
    write_config(state, "slow = 15", ADMISSION)
    proc = start_daemon_config(state)
    try:
        t0 = time.monotonic()
        seen = run_turns(state, "slow", 15)
        wall = time.monotonic() - t0
    finally:
        stop_daemon(proc, state)
    times = sorted(ts for _, ts in seen["granted"])
    most = max(len([u for u in times[i:] if u < t + 1.0]) for i, t in enumerate(times))
    return most, wall


def resume_to_grant(state: Path, runs: int = 10) -> list[float]:
    write_config(state, "p = 1", "")
    proc = start_daemon_config(state)
    gaps = []
    try:
        with Client(state, timeout=10) as client, client.subscribe(["turn.", "key."]) as sub:
            for i in range(runs):
                client.pause("p", for_=0.2)
                client.turn("p", ["true"], id=f"p{i}")
                resumed = granted = None
                while granted is None:
                    topic, body = sub.recv(10)
                    if topic == "key.p.resumed":
                        resumed = body["ts"]
                    if topic == f"turn.p{i}.granted":
                        granted = body["ts"]
                while True:  # let it end before the next pause
                    topic, _ = sub.recv(10)
                    if topic == f"turn.p{i}.released":
                        break
                gaps.append((granted - resumed) * 1000)
    finally:
        stop_daemon(proc, state)
    return gaps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--cap", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ccsup-b-", dir="/tmp"))
    try:
        dirs = {}
        for name in ("rate", "resume"):
            dirs[name] = root / name
            dirs[name].mkdir(mode=0o700)
        limited, plain = policy_us(True), policy_us(False)
        withs, withouts = [], []
        for i in range(args.rounds):
            for name, admission, times in (("without", "", withouts), ("with", ADMISSION, withs)):
                state = root / f"{name}{i}"
                state.mkdir(mode=0o700)
                times.append(through(state, args.turns, args.cap, admission))
        without, with_ = statistics.median(withouts), statistics.median(withs)
        most, wall = rate_run(dirs["rate"])
        gaps = sorted(resume_to_grant(dirs["resume"]))
        print(
            json.dumps(
                {
                    "bench": "admission",
                    "turns": args.turns,
                    "cap": args.cap,
                    "policy_us_limited": round(limited, 2),
                    "policy_us_plain": round(plain, 2),
                    "with_s": round(with_, 3),
                    "without_s": round(without, 3),
                    "ratio": round(with_ / without, 3),
                    "rate_max_in_window": most,
                    "rate_wall_s": round(wall, 3),
                    "resume_to_grant_ms_median": round(gaps[len(gaps) // 2], 1),
                    "resume_to_grant_ms_max": round(gaps[-1], 1),
                }
            )
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
