"""A turn's workload that is large and awkward: N subtrees, each detaching twice.

    python tests/helpers/bigtree.py N [SECONDS]

Subtree i: a child that calls setsid() (group A), forks two `sleep SECONDS` in A and a third
child that calls setsid() again (group B) and forks one `sleep` in B; both intermediates exit, so
both groups are leaderless and every sleep is reparented (to the guard, a subreaper). 3 processes
and 2 groups a subtree, the worst case for group liveness (no leader to look up). After each
subtree has started, one line `<i>` goes to stdout (flushed), so a test can act while it forks;
then `done` and the driver sleeps. Used by tests/guards/test_bigtree.py and tests/bench/bench_bigtree.py.
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


def cancel_while_forking(state_dir, subtrees: int, cancel_at: int, reference=None) -> dict:
    """Start a bigtree turn of `subtrees`, cancel it once `cancel_at` subtrees have started, and
    measure: processes and groups at the cancel, seconds from the cancel to `released`, the slowest
    `status` answer from the request to the release (asked every 10 ms from a process of its own,
    tests/helpers/status_poller.py), and what of the turn still runs after. With `reference` (the
    state directory of another, idle supervisor), its slowest `status` over the same time too: what
    the machine's load alone costs a supervisor's answer in this run.
    """
    import contextlib
    import uuid
    from pathlib import Path

    from status_poller import StatusPoller

    from guardd import procs
    from supervisor.client import Client

    turn_id = "big" + uuid.uuid4().hex[:8]
    stdout = Path(state_dir) / "turns" / turn_id / "stdout.log"
    with contextlib.ExitStack() as stack:
        poller = stack.enter_context(StatusPoller(state_dir))
        idle = stack.enter_context(StatusPoller(reference)) if reference else None
        with Client(state_dir, timeout=30) as client:
            with client.subscribe([f"turn.{turn_id}."]) as sub:
                found = _cancel_at(client, sub, turn_id, stdout, subtrees, cancel_at)
        slowest = poller.slowest()
        if idle is not None:
            found["reference_status_max_ms"] = round(idle.slowest() * 1000, 1)
    left = procs.processes_with_env("CCSUP_TURN", turn_id)
    return {
        "subtrees": subtrees,
        "started_at_cancel": cancel_at,
        **found,
        "status_max_ms": round(slowest * 1000, 1),
        "poller_late_ms": round(poller.lateness * 1000, 1),
        "left_running": len(left),
    }


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
