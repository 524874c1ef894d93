"""The supervisor's memory under two loads that grew it without bound, each run
against the same supervisor with its bounds lifted (the behaviour before), in the same run:

- `subscriber`: a subscriber to `turn.` suspended (SIGSTOP, as Ctrl-Z) while a turn writes
  --mb MB (default 400) of output: the supervisor's RSS before the turn and at its release;
- `stdin`: --sends sends (default 200) of 900 KB to a turn that does not read its stdin: RSS
  before and after, with how many were taken and how many refused `busy`.

One JSON line per case and variant: {"case", "variant": "bounded"|"unbounded", "rss_before_mib",
"rss_after_mib", "grown_mib", ...}. The unbounded variant starts the same daemon with
supervisor.daemon.server.SUBSCRIBER_BYTES and supervisor.turns.manager.STDIN_MAX_PENDING set
past any load (a benchmark-only start; no setting of the product lifts them).

    .venv/bin/python tests/bench/bench_memory.py [--mb 400] [--sends 200]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_daemon import run_daemon  # noqa: E402

from supervisor.client import Client  # noqa: E402
from supervisor.client.control import RemoteError  # noqa: E402

MiB = 1 << 20
UNBOUNDED = (
    "import sys; import supervisor.daemon.server as s, supervisor.turns.manager as m; "
    "s.SUBSCRIBER_BYTES = m.STDIN_MAX_PENDING = 1 << 62; "
    "from supervisor.cli import main; main(prog_name='ccsup')"
)
SUBSCRIBER = (
    "import os, signal, sys\n"
    "from supervisor.client import Client\n"
    "with Client(sys.argv[1], timeout=30) as client:\n"
    "    sub = client.subscribe(['turn.'])\n"
    "    print('ready', flush=True)\n"
    "    os.kill(os.getpid(), signal.SIGSTOP)\n"
)


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def wait_for(sub, topic: str, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        event = sub.recv(1.0)
        if event is not None and event[0] == topic:
            return
    raise SystemExit(f"no {topic} in {timeout}s")


def daemon(variant: str) -> tuple[Path, subprocess.Popen]:
    state = Path(tempfile.mkdtemp(prefix="ccsup-bm-", dir="/tmp"))
    config = state / "ccsup.toml"
    config.write_text('[slots]\ncaps = { m = 1 }\n[logs]\nturn_max_bytes = "2GiB"\n')
    if variant == "unbounded":
        import bench_daemon

        old = bench_daemon.CCSUP
        bench_daemon.CCSUP = [sys.executable, "-c", UNBOUNDED]
        try:
            return state, run_daemon(state, config)
        finally:
            bench_daemon.CCSUP = old
    return state, run_daemon(state, config)


def subscriber_case(variant: str, mb: int) -> dict:
    state, proc = daemon(variant)
    sub = subprocess.Popen([sys.executable, "-c", SUBSCRIBER, str(state)], stdout=subprocess.PIPE)
    try:
        assert sub.stdout is not None and sub.stdout.readline() == b"ready\n"
        while open(f"/proc/{sub.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "T":
            time.sleep(0.01)
        before = rss(proc.pid)
        total = mb * 1000 * 1000
        with Client(state, timeout=30) as client, client.subscribe(["turn.w.released"]) as events:
            client.turn("m", ["sh", "-c", f"yes 0123456789abcdef | head -c {total}"], id="w")
            wait_for(events, "turn.w.released")
        after = rss(proc.pid)
        logged = os.path.getsize(state / "turns" / "w" / "stdout.log")
        return line("subscriber", variant, before, after, output_mb=mb, log_exact=logged == total)
    finally:
        os.kill(sub.pid, signal.SIGCONT)
        sub.kill()
        sub.wait()
        stop(state, proc)


def stdin_case(variant: str, sends: int) -> dict:
    state, proc = daemon(variant)
    try:
        with Client(state, timeout=30) as client, client.subscribe(["turn.s.started"]) as events:
            client.turn("m", ["sleep", "600"], id="s")
            wait_for(events, "turn.s.started")
            before = rss(proc.pid)
            taken = refused = 0
            piece = "x" * 900_000
            for _ in range(sends):
                try:
                    taken += client.send("s", piece)["written"]
                except RemoteError as e:
                    assert e.code == "busy", e
                    refused += 1
            after = rss(proc.pid)
            client.cancel("s")
        return line("stdin", variant, before, after, sends=sends, taken=taken, busy=refused)
    finally:
        stop(state, proc)


def line(case: str, variant: str, before: int, after: int, **more) -> dict:
    return {
        "case": case,
        "variant": variant,
        "rss_before_mib": round(before / MiB, 1),
        "rss_after_mib": round(after / MiB, 1),
        "grown_mib": round((after - before) / MiB, 1),
        **more,
    }


def stop(state: Path, proc: subprocess.Popen) -> None:
    try:
        with Client(state, timeout=30) as client:
            client.quit()
        proc.wait(60)
    except Exception:  # noqa: BLE001 -- whatever went wrong, the daemon is ended by pid
        proc.kill()
        proc.wait()
    shutil.rmtree(state, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=400, help="output written while suspended")
    parser.add_argument("--sends", type=int, default=200, help="sends of 900 KB")
    args = parser.parse_args()
    for variant in ("bounded", "unbounded"):
        print(json.dumps(subscriber_case(variant, args.mb)), flush=True)
    for variant in ("bounded", "unbounded"):
        print(json.dumps(stdin_case(variant, args.sends)), flush=True)


if __name__ == "__main__":
    main()
