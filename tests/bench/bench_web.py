"""The live page's delay: from a turn request to the page's stream saying so, against the bus.

    .venv/bin/python tests/bench/bench_web.py [--turns 100] [--waiters 0]

A real supervisor (key `codex`, cap 1, held by one `sleep`) and a real `ccsup web` in a temporary
state directory; `--waiters` turns wait first (the page's state grows with them). Then, one at a
time, a turn is requested that must wait, and two readers note when they learn of it:
- `bus_ms`: a direct bus subscriber sees `turn.<id>.queued` (the reference: the floor any client
  of the supervisor has);
- `page_ms`: the page's server-sent `state` event lists the turn among the waiters (what a browser
  receives; the browser's own drawing is not in it).
Prints one JSON line: medians and 95th percentiles in milliseconds, and the size of the last
`state` event in bytes. Everything it starts is stopped at the end (`ccsup stop`, the page by pid).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from supervisor.client import Client  # noqa: E402


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--waiters", type=int, default=0)
    args = parser.parse_args()
    state = Path(tempfile.mkdtemp(prefix="ccsup-bw-", dir="/tmp"))
    os.chmod(state, 0o700)
    config = state / "ccsup.toml"
    config.write_text('[slots]\ncaps = { codex = 1 }\n[guard]\ngrace = "300ms"\n')
    base = [sys.executable, "-m", "supervisor", "--state-dir", str(state), "--config", str(config)]
    subprocess.run([*base, "start"], check=True, capture_output=True, cwd=ROOT)
    web = subprocess.Popen(
        [*base, "web", "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        start_new_session=True,
    )
    try:
        url = web.stdout.readline().split()[3]
        seen_page: dict[str, float] = {}
        sizes: list[int] = []
        lock = threading.Lock()

        def read_stream() -> None:
            with urllib.request.urlopen(url + "api/events", timeout=600) as stream:
                kind = None
                for raw in stream:
                    line = raw.decode()
                    if line.startswith("event: "):
                        kind = line[7:].strip()
                    elif line.startswith("data: ") and kind == "state":
                        now = time.perf_counter()
                        sizes.append(len(raw))
                        waits = json.loads(line[6:])["waits"]
                        with lock:
                            for wait in waits:
                                seen_page.setdefault(wait["id"], now)

        with Client(state, timeout=60) as client:
            client.turn("codex", ["sleep", "600"], id="holder")
            for i in range(args.waiters):
                client.turn("codex", ["true"], id=f"pre{i}")
            threading.Thread(target=read_stream, daemon=True).start()
            bus, page = [], []
            with client.subscribe(["turn."]) as sub:
                time.sleep(1.0)  # the stream is open and has its first snapshot
                for i in range(args.turns):
                    turn_id = f"b{i}"
                    asked = time.perf_counter()
                    client.turn("codex", ["true"], id=turn_id)
                    while True:
                        event = sub.recv(10)
                        if event is None:
                            raise SystemExit(f"no queued event for {turn_id}")
                        if event[0] == f"turn.{turn_id}.queued":
                            bus.append((time.perf_counter() - asked) * 1000)
                            break
                    deadline = time.monotonic() + 10
                    while time.monotonic() < deadline:
                        with lock:
                            if turn_id in seen_page:
                                page.append((seen_page[turn_id] - asked) * 1000)
                                break
                        time.sleep(0.001)
                    else:
                        raise SystemExit(f"the page never listed {turn_id}")
        print(
            json.dumps(
                {
                    "bench": "web",
                    "turns": args.turns,
                    "waiters": args.waiters,
                    "bus_ms": round(statistics.median(bus), 2),
                    "bus_p95_ms": round(p95(bus), 2),
                    "page_ms": round(statistics.median(page), 2),
                    "page_p95_ms": round(p95(page), 2),
                    "state_event_bytes": sizes[-1] if sizes else None,
                }
            )
        )
    finally:
        web.send_signal(signal.SIGTERM)
        web.wait(10)
        subprocess.run([*base, "stop", "--timeout", "120"], capture_output=True, cwd=ROOT)
        import shutil

        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    main()
