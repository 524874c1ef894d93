"""A turn's workload that is large and awkward: N subtrees, each detaching twice.

    python tests/bigtree.py N [SECONDS]

Subtree i: a child that calls setsid() (group A), forks two `sleep SECONDS` in A and a third
child that calls setsid() again (group B) and forks one `sleep` in B; both intermediates exit, so
both groups are leaderless and every sleep is reparented (to the guard, a subreaper). 3 processes
and 2 groups a subtree, the worst case for group liveness (no leader to look up). After each
subtree has started, one line `<i>` goes to stdout (flushed), so a test can act while it forks;
then `done` and the driver sleeps. Used by tests/test_bigtree.py and tests/bench/bench_bigtree.py.
"""

from __future__ import annotations

import os
import sys

SLEEP = "/bin/sleep"


def _sleeper(seconds: str) -> None:
    if os.fork() == 0:
        try:
            os.execv(SLEEP, [SLEEP, seconds])
        finally:
            os._exit(127)


def subtree(seconds: str) -> None:
    pid = os.fork()
    if pid:
        os.waitpid(pid, 0)  # the intermediate exits at once; its children are orphaned
        return
    try:
        os.setsid()
        _sleeper(seconds)
        _sleeper(seconds)
        if os.fork() == 0:
            os.setsid()
            _sleeper(seconds)
    finally:
        os._exit(0)


def main() -> None:
    count = int(sys.argv[1])
    seconds = sys.argv[2] if len(sys.argv) > 2 else "300"
    for i in range(count):
        subtree(seconds)
        sys.stdout.write(f"{i + 1}\n")
        sys.stdout.flush()
    sys.stdout.write("done\n")
    sys.stdout.flush()
    os.execv(SLEEP, [SLEEP, seconds])


if __name__ == "__main__":
    main()


# -- measuring a cancel of it through a running supervisor (test and bench) ------------------------


def cancel_while_forking(state_dir, subtrees: int, cancel_at: int) -> dict:
    """Start a bigtree turn of `subtrees`, cancel it once `cancel_at` subtrees have started, and
    measure: processes and groups at the cancel, seconds from the cancel to `released`, the slowest
    `status` answer from the request to the release (a client in a process of its own asks every
    10 ms: a thread here would count this process's own pauses, its garbage collections and its
    scans of /proc, as the supervisor's), and what of the turn still runs after.
    """
    import subprocess
    import uuid
    from pathlib import Path

    from guardd import procs
    from supervisor.client import Client

    turn_id = "big" + uuid.uuid4().hex[:8]
    stdout = Path(state_dir) / "turns" / turn_id / "stdout.log"
    poller = subprocess.Popen(
        [sys.executable, "-c", _STATUS_POLLER, str(state_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert poller.stdout is not None and poller.stdin is not None
        if poller.stdout.readline().strip() != "ready":
            raise RuntimeError("the status poller did not start")
        with Client(state_dir, timeout=30) as client:
            with client.subscribe([f"turn.{turn_id}."]) as sub:
                found = _cancel_at(client, sub, turn_id, stdout, subtrees, cancel_at)
        poller.stdin.close()  # its cue to stop and say its slowest answer
        slowest = float(poller.stdout.readline())
        poller.wait(10)
    finally:
        if poller.poll() is None:
            poller.kill()  # by its pid
            poller.wait()
    left = procs.processes_with_env("CCSUP_TURN", turn_id)
    return {
        "subtrees": subtrees,
        "started_at_cancel": cancel_at,
        **found,
        "status_max_ms": round(slowest * 1000, 1),
        "left_running": len(left),
    }


# Asks `status` every 10 ms until its stdin closes, then prints the slowest answer in seconds.
_STATUS_POLLER = """
import select, sys, time
from supervisor.client import Client
slowest = 0.0
with Client(sys.argv[1], timeout=30) as client:
    client.status()
    print("ready", flush=True)
    while not select.select([sys.stdin], [], [], 0.01)[0]:
        t0 = time.monotonic()
        client.status()
        slowest = max(slowest, time.monotonic() - t0)
print(slowest, flush=True)
"""


def _cancel_at(client, sub, turn_id: str, stdout, subtrees: int, cancel_at: int) -> dict:
    import time

    from guardd import procs

    client.turn("big", [sys.executable, __file__, str(subtrees)], id=turn_id)
    started = False
    while not started:
        event = sub.recv(30)
        if event is None:
            raise TimeoutError("no started event within 30 s")
        started = event[0].endswith(".started")
    deadline = time.monotonic() + 120
    while True:
        lines = stdout.read_bytes().split() if stdout.exists() else []
        if len(lines) >= cancel_at:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(lines)} subtrees started in 120 s")
        time.sleep(0.005)
    work = procs.processes_with_env("CCSUP_TURN", turn_id)
    stats = [procs.read_stat(i.pid) for i in work]
    t0 = time.monotonic()
    client.cancel(turn_id)
    while True:
        event = sub.recv(120)
        if event is None:
            raise TimeoutError("no released event within 120 s of the cancel")
        if event[0].endswith(".released"):
            released = time.monotonic() - t0
            break
    return {
        "processes_at_cancel": sum(1 for s in stats if s is not None and not s.zombie),
        "groups_at_cancel": len({s.pgid for s in stats if s is not None and not s.zombie}),
        "release_after_cancel_s": round(released, 3),
        "still_forking_at_cancel": len(lines) < subtrees,
    }
