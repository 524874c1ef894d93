"""Throughput and latency through the daemon, against a plain driver in the same run.

    .venv/bin/python tests/bench/bench_daemon.py [--turns 200] [--cap 4] [--lose-zygote]

Prints one JSON line:
- `ccsup_s` / `plain_s`: wall time of N turns of `sleep 0.05` at cap C through a real daemon
  (requests from one client, all at once) and through subprocess + a semaphore of C threads;
  `ratio` = ccsup_s / plain_s (goal <= 1.3). `--lose-zygote`: the daemon's guard zygote is
  SIGKILLed 2 s before the turns are asked for (what a turn costs once a zygote has been lost:
  started directly, or by the zygote started in its place).
- `handoff_ms_median` / `_p90`: from a turn's `gone` (its last group gone) to the next waiter's
  CMD running (the moment it writes its start), cap 1, 30 turns (goal median < 50 ms).
- `ps_ms_median`: `ccsup ps --json` as a subprocess (CLI start-up included) with 100 slots.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import zmq

from supervisor.client import Client
from supervisor.wire import protocol

ROOT = Path(__file__).resolve().parents[2]
# Turn ids unique to this run: a reaper of another test on the machine ends escapees by their
# CCSUP_TURN marker, so a common id such as `b1` can be ended by someone else's test.
RUN = uuid.uuid4().hex[:8]
CCSUP = [sys.executable, "-m", "supervisor"]


def run_daemon(state: Path, config: Path, *, wait: float = 20) -> subprocess.Popen:
    """`ccsup start --foreground` in its own session, returned once `status` answers; every
    benchmark starts its daemon through this one function."""
    with open(state / "daemon.err", "wb") as err:
        proc = subprocess.Popen(
            [*CCSUP, "--state-dir", str(state), "--config", str(config), "start", "--foreground"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            with Client(state, timeout=1) as c:
                c.status()
            return proc
        except Exception:  # not up yet: any failure means "try again"
            time.sleep(0.02)
    proc.kill()
    proc.wait()
    raise SystemExit(f"daemon did not start: {(state / 'daemon.err').read_text()[-500:]}")


def connected_publisher(client: Client) -> zmq.Socket:
    """A publisher on bus-in whose connection is up, subscription included: an XPUB (a PUB that
    shows the subscriptions it gets), returned once the supervisor's XSUB has subscribed. A new
    PUB drops what it sends before that, and a sidecar's publisher is connected long before its
    requests: ZeroMQ's connection set-up is no part of a turn's cost."""
    pub = client._socket(zmq.XPUB, client.bus_in_endpoint)
    if not pub.poll(10_000, zmq.POLLIN):
        raise SystemExit("the supervisor's bus-in did not subscribe within 10 s")
    pub.recv()
    return pub


def request_turn(pub: zmq.Socket, turn_id: str, key: str, argv: list[str]) -> None:
    """One `request.turn` on the bus, as a sidecar publishes it."""
    body = {"v": protocol.VERSION, "ts": time.time(), "id": turn_id, "key": key, "argv": argv}
    pub.send_multipart([b"request.turn", protocol.dumps(body)])


def wait_started(sub, n: int, on_started: Callable[[int], None] | None = None) -> None:
    """Until n turns' `started` events have come on sub (on_started(k) after the k-th).
    SystemExit when 120 s pass without an event, or a turn ends before all have started."""
    started = 0
    while started < n:
        event = sub.recv(120)
        if event is None:
            raise SystemExit(f"only {started} of {n} started after 120 s without an event")
        if event[0].endswith(".started"):
            started += 1
            if on_started is not None:
                on_started(started)
        elif event[0].endswith((".exited", ".cancelled", ".rejected")):
            raise SystemExit(f"{event[0]} before all {n} started: {event[1]}")


def start_daemon(state: Path, caps: str) -> subprocess.Popen:
    config = state / "ccsup.toml"
    config.write_text(f'[slots]\ncaps = {{ {caps} }}\n[guard]\ngrace = "1s"\nscan = "2s"\n')
    return run_daemon(state, config)


def stop_daemon(proc: subprocess.Popen, state: Path) -> None:
    try:
        with Client(state) as c:
            c.quit()
        proc.wait(30)
    except Exception:
        proc.kill()
        proc.wait()


def plain_driver(turns: int, cap: int) -> float:
    gate = threading.Semaphore(cap)

    def one():
        with gate:
            subprocess.run(["sleep", "0.05"])

    threads = [threading.Thread(target=one) for _ in range(turns)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.monotonic() - t0


def zygote_of(pid: int) -> int:
    """The daemon's guard zygote (its child running guardd.zygote)."""
    for task in os.listdir(f"/proc/{pid}/task"):
        for child in Path(f"/proc/{pid}/task/{task}/children").read_text().split():
            try:
                if b"guardd.zygote" in Path(f"/proc/{child}/cmdline").read_bytes():
                    return int(child)
            except OSError:
                continue  # ended while we looked
    raise SystemExit("the daemon has no guard zygote")


def through_ccsup(state: Path, turns: int, cap: int, lose_zygote: bool = False) -> float:
    proc = start_daemon(state, f"bench = {cap}")
    try:
        if lose_zygote:
            os.kill(zygote_of(proc.pid), signal.SIGKILL)
            time.sleep(2)  # the launcher starts another after 1 s
        with Client(state, timeout=10) as client, client.subscribe(["turn.b"]) as sub:
            t0 = time.monotonic()
            for i in range(turns):
                client.turn("bench", ["sleep", "0.05"], id=f"b{RUN}-{i}")
            done = 0
            while done < turns:
                event = sub.recv(60)
                if event is None:
                    raise SystemExit("no event for 60 s")
                if event[0].endswith((".released", ".cancelled", ".rejected")):
                    done += 1
            return time.monotonic() - t0
    finally:
        stop_daemon(proc, state)


def handoff(state: Path, turns: int = 30) -> list[float]:
    proc = start_daemon(state, "hand = 1")
    marks = state / "marks"
    marks.mkdir()
    gaps = []
    try:
        with Client(state, timeout=10) as client, client.subscribe(["turn.h"]) as sub:
            gone_at = {}
            for i in range(turns):
                client.turn("hand", ["sh", "-c", f"date +%s.%N > {marks}/h{i}"], id=f"h{RUN}-{i}")
            done = 0
            while done < turns:
                topic, body = sub.recv(60)
                if topic.endswith(".gone"):
                    gone_at[int(body["id"].rsplit("-", 1)[1])] = body["ts"]
                if topic.endswith(".released"):
                    done += 1
        for i in range(1, turns):
            started = float((marks / f"h{i}").read_text())
            gaps.append((started - gone_at[i - 1]) * 1000)
    finally:
        stop_daemon(proc, state)
    return gaps


def ps_roundtrip(state: Path, runs: int = 10) -> list[float]:
    caps = ", ".join(f"k{i} = 10" for i in range(10))  # 10 keys x 10 slots = 100 slots
    proc = start_daemon(state, caps)
    times = []
    try:
        ccsup = [sys.executable, "-m", "supervisor", "--state-dir", str(state), "ps", "--json"]
        for _ in range(runs):
            t0 = time.monotonic()
            out = subprocess.run(ccsup, capture_output=True, check=True).stdout
            times.append((time.monotonic() - t0) * 1000)
        assert sum(t["cap"] for t in json.loads(out)["slot_keys"]) == 100  # free: counted
    finally:
        stop_daemon(proc, state)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--cap", type=int, default=4)
    parser.add_argument("--lose-zygote", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ccsup-b-", dir="/tmp"))
    try:
        dirs = {}
        for name in ("throughput", "handoff", "ps"):
            dirs[name] = root / name
            dirs[name].mkdir(mode=0o700)
        plain = plain_driver(args.turns, args.cap)
        ccsup = through_ccsup(dirs["throughput"], args.turns, args.cap, args.lose_zygote)
        gaps = handoff(dirs["handoff"])
        ps = ps_roundtrip(dirs["ps"])
        print(
            json.dumps(
                {
                    "bench": "daemon",
                    "turns": args.turns,
                    "cap": args.cap,
                    "zygote_lost_before": args.lose_zygote,
                    "plain_s": round(plain, 3),
                    "ccsup_s": round(ccsup, 3),
                    "ratio": round(ccsup / plain, 3),
                    "handoff_ms_median": round(statistics.median(gaps), 1),
                    "handoff_ms_p90": round(sorted(gaps)[int(len(gaps) * 0.9)], 1),
                    "ps_ms_median": round(statistics.median(ps), 1),
                }
            )
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
