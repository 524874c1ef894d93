"""`ccsup restart` with N running turns, against a plain `ccsup stop; ccsup start` in the same run.

    .venv/bin/python tests/bench/bench_restart.py        # N from $CCSUP_BENCH_RESTART_TURNS, 500

A detached supervisor (`ccsup start`, cap N on key `s`, `[guard] adopt_within = "30s"`, grace
1s), N turns of `sleep 600` requested at once on the bus; once every one has started:
- `ccsup restart --timeout 60` as a subprocess. `restart_s`: its wall time (CLI start-up
  included; it returns once the new supervisor has adopted every turn); `adopted_s`: from the
  command's start until a status poller first sees the new supervisor with `adopted` = N and no
  guard waiting (goal <= 2 s); `adopted`: that count; `turns_alive`: how many of the N `sleep`s
  still run afterwards, by pid and start time (N when no turn ended). From the log: `hand_over_s`
  (the old supervisor's quit to its last line), `take_over_s` (from there to the new one's start
  line: the old process's exit and the new one's set-up) and `adoption_s` (its start to its
  "adopted" line; it answers once that is done).
- A client asks `status` every 10 ms throughout (a new Client after any failure, as a restarted
  program would; each ask bounded by 0.5 s). `no_answer_max_s`: the longest time between two
  answers it got (goal <= 1 s).
- The reference, in the same run on the same N turns: `ccsup stop` (every turn ended and
  confirmed gone) then `ccsup start`, timed the same way (`reference_s`, `reference_no_answer_max_s`),
  with `reference_turns_alive` (0: a stop ends them).
Prints one JSON line `"bench": "restart"`. Clean-up: `ccsup stop`, then SIGKILL by pid of every
supervisor it started and of any `sleep` of its turns still running.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_daemon import connected_publisher, request_turn, wait_started  # noqa: E402

from guardd import procs  # noqa: E402
from supervisor.client import Client  # noqa: E402
from supervisor.errors import CcsupError  # noqa: E402

CCSUP = [sys.executable, "-m", "supervisor"]
RUN = uuid.uuid4().hex[:8]
POLL = 0.01


def ccsup(state: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("CCSUP_CONFIG", "NOTIFY_SOCKET")}
    return subprocess.run(
        [*CCSUP, "--state-dir", str(state), "--config", str(state / "ccsup.toml"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class StatusPoller(threading.Thread):
    """Asks `status` every POLL seconds; keeps the time of each answer and what it said."""

    def __init__(self, state: Path):
        super().__init__(daemon=True)
        self.state = state
        self.answers: list[tuple[float, int, int, int]] = []  # (time, pid, adopted, waiting)
        self.stopped = threading.Event()

    def run(self) -> None:
        client: Client | None = None
        while not self.stopped.is_set():
            try:
                if client is None:
                    client = Client(self.state, timeout=0.5)
                status = client.status()
                self.answers.append(
                    (
                        time.monotonic(),
                        int(status["pid"]),
                        int(status.get("adopted") or 0),
                        int(status.get("waiting_adoption") or 0),
                    )
                )
            except CcsupError:
                if client is not None:
                    client.close()
                client = None
            time.sleep(POLL)
        if client is not None:
            client.close()

    def longest_silence(self, since: float, until: float) -> float:
        times = [t for t, *_ in self.answers if since <= t <= until]
        return max((b - a for a, b in zip(times, times[1:], strict=False)), default=until - since)

    def first(self, since: float, pid_not: int, adopted: int) -> float | None:
        for t, pid, got, waiting in self.answers:
            if t >= since and pid != pid_not and got >= adopted and waiting == 0:
                return t
        return None


def sleeps_of(state: Path, turn_ids: list[str]) -> list[procs.Identity]:
    """Each turn's `sleep` (CMD, the leader of the turn's own group), by its guard record."""
    found = []
    for record in (state / "guards").glob("*.json"):
        try:
            data = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        if data.get("turn") not in turn_ids:
            continue
        for entry in [data.get("own_group") or {}, *(data.get("groups") or [])]:
            if "pgid" not in entry:
                continue
            ident = procs.identity_of(int(entry["pgid"]))
            if ident is not None and ident.start == entry.get("leader_start"):
                found.append(ident)
    return found


def phases(log: Path, new_pid: int) -> dict[str, float | None]:
    """From the supervisors' log: the hand-over itself (quit to exit), the take-over (the old
    one's last line to the new one's start) and the adoption (that start to its adopted line)."""
    import datetime

    seen: dict[str, float] = {}
    marks = {
        "handing over:": "handing",
        "handed over": "handed",
        f"(pid {new_pid},": "started",
        "ccsup.adopt: adopted": "adopted",
    }
    for line in log.read_text(errors="replace").splitlines():
        for needle, name in marks.items():
            if needle in line and name not in seen and (name != "adopted" or "started" in seen):
                stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
                seen[name] = stamp.timestamp()

    def between(a: str, b: str) -> float | None:
        return round(seen[b] - seen[a], 3) if a in seen and b in seen else None

    return {
        "hand_over_s": between("handing", "handed"),
        "take_over_s": between("handed", "started"),
        "adoption_s": between("started", "adopted"),
    }


def alive(idents: list[procs.Identity]) -> int:
    return sum(1 for i in idents if procs.process_running(i))


def supervisor_pid(state: Path) -> int:
    with Client(state, timeout=5) as c:
        return int(c.status()["pid"])


def main() -> None:
    n = int(os.environ.get("CCSUP_BENCH_RESTART_TURNS", "500"))
    state = Path(tempfile.mkdtemp(prefix="ccsup-br-", dir="/tmp"))
    (state / "ccsup.toml").write_text(
        f'[slots]\ncaps = {{ s = {n} }}\n[guard]\ngrace = "1s"\nscan = "2s"\nadopt_within = "30s"\n'
    )
    started_pids: list[procs.Identity] = []
    sleeps: list[procs.Identity] = []
    poller = StatusPoller(state)
    result: dict = {"bench": "restart", "turns": n}
    try:
        done = ccsup(state, "start")
        if done.returncode != 0:
            raise SystemExit(f"ccsup start failed: {done.stderr}")
        first = procs.identity_of(supervisor_pid(state))
        assert first is not None
        started_pids.append(first)
        ids = [f"br-{RUN}-{k}" for k in range(n)]
        with Client(state, timeout=10) as client:
            sub = client.subscribe(["turn."])
            pub = connected_publisher(client)
            for turn_id in ids:
                request_turn(pub, turn_id, "s", ["sleep", "600"])
            wait_started(sub, n)
            sub.close()
            pub.close(linger=0)
        time.sleep(1.0)  # every guard's record written (its groups named) before we look
        sleeps = sleeps_of(state, ids)
        result["sleeps_found"] = len(sleeps)
        poller.start()
        time.sleep(0.3)

        t0 = time.monotonic()
        done = ccsup(state, "restart", "--timeout", "60")
        t1 = time.monotonic()
        result["restart_exit"] = done.returncode
        result["restart_output"] = (done.stdout + done.stderr).strip()[-300:]
        result["restart_s"] = round(t1 - t0, 3)
        second = procs.identity_of(supervisor_pid(state))
        assert second is not None
        started_pids.append(second)
        seen = poller.first(t0, first.pid, n)
        result["adopted_s"] = None if seen is None else round(seen - t0, 3)
        result["adopted"] = max((a for t, p, a, _ in poller.answers if p == second.pid), default=0)
        time.sleep(0.3)
        result["no_answer_max_s"] = round(poller.longest_silence(t0 - 0.1, time.monotonic()), 3)
        result["turns_alive"] = alive(sleeps)
        result.update(phases(state / "ccsup.log", second.pid))

        # The reference: a plain stop and start, on the same turns.
        t2 = time.monotonic()
        stopped = ccsup(state, "stop", "--timeout", "120")
        started = ccsup(state, "start")
        t3 = time.monotonic()
        if stopped.returncode != 0 or started.returncode != 0:
            result["reference_error"] = (stopped.stderr + started.stderr).strip()[-300:]
        else:
            third = procs.identity_of(supervisor_pid(state))
            assert third is not None
            started_pids.append(third)
        time.sleep(0.3)
        result["reference_s"] = round(t3 - t2, 3)
        result["reference_no_answer_max_s"] = round(
            poller.longest_silence(t2 - 0.1, time.monotonic()), 3
        )
        result["reference_turns_alive"] = alive(sleeps)
        result["goals"] = {"adopted_s": 2.0, "no_answer_max_s": 1.0}
        result["load_avg_1m"] = round(os.getloadavg()[0], 2)
    finally:
        poller.stopped.set()
        ccsup(state, "stop", "--timeout", "120")
        for ident in [*started_pids, *sleeps]:
            if procs.process_running(ident):
                procs.signal_process(ident, signal.SIGKILL)
        shutil.rmtree(state, ignore_errors=True)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
