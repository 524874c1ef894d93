"""`status` asked every 10 ms by a client in a process of its own; the slowest answer.

A thread of the measuring process would count that process's own pauses (its garbage
collections, its scans of /proc) as the supervisor's, so the asking is a process of its own, as a
user's `ccsup status` would be. The poller also measures how late its own 10 ms waits end (the
slowest lateness): what a loaded machine's scheduler costs a process in the same run, a reference
a test may allow on top of its goal (under two CPU hogs and a 1,000-process tree forking on 2
cores: 35-80 ms late, with statuses of 52-109 ms). Used by tests/helpers/bigtree.py and tests/bench/bench_zygote_loss.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Asks until its stdin closes, then prints the slowest answer and the slowest lateness of its
# own 10 ms waits, in seconds.
_POLLER = """
import select, sys, time
sys.path.insert(0, sys.argv[2])
from supervisor.client import Client
slowest = late = 0.0
with Client(sys.argv[1], timeout=30) as client:
    client.status()
    print("ready", flush=True)
    while True:
        t0 = time.monotonic()
        if select.select([sys.stdin], [], [], 0.01)[0]:
            break
        late = max(late, time.monotonic() - t0 - 0.01)
        t0 = time.monotonic()
        client.status()
        slowest = max(slowest, time.monotonic() - t0)
print(slowest, late, flush=True)
"""


class StatusPoller:
    """`with StatusPoller(state_dir) as poller:` asks from its first answer on; `slowest()` stops
    it and says the slowest answer in seconds. Ended by its pid whatever happens."""

    def __init__(self, state_dir: Path | str):
        self.lateness = 0.0  # seconds: set by slowest()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _POLLER, str(state_dir), str(ROOT)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def __enter__(self) -> StatusPoller:
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            self.__exit__()
            raise RuntimeError("the status poller did not start")
        return self

    def slowest(self) -> float:
        """Stops it; the slowest answer in seconds (`lateness` then holds its own)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()  # its cue to stop and say its slowest answer
        slowest, self.lateness = map(float, self.proc.stdout.readline().split())
        self.proc.wait(10)
        return slowest

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
