"""A `ccsup run -t` whose bus queue overflowed past its turn's end still ends: every event after
some point was dropped for it (its terminal events and `supervisor.turn_ended` among them), so
nothing more comes on the bus, and it asks the supervisor (`ps`, the history) instead of waiting
for good.

The client is SIGSTOPped (its ZeroMQ threads too) while its turn writes 40 MB, more than the bus
queues for one subscriber (supervisor.daemon.server's SUBSCRIBER_BYTES), and continued once the
turn's slot is free (its end published): the events it gets then have a hole, and the end is not among
them. Its terminal is a pty the test reads (and discards) the whole time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest
from conftest import wait_until

from supervisor.client import Client

CCSUP = [sys.executable, "-m", "supervisor"]
MB = 40


def _discard(fd: int, seen: list[int]) -> None:
    while True:
        try:
            data = os.read(fd, 1 << 16)
        except OSError:  # EIO: the client and its terminal are gone
            return
        if not data:
            return
        seen[0] += len(data)


@pytest.mark.timeout(120)
def test_run_t_ends_when_its_turns_end_was_dropped_from_its_queue(daemon, state_dir):
    d = daemon()
    master, slave = os.openpty()
    seen = [0]
    reader = threading.Thread(target=_discard, args=(master, seen), daemon=True)
    reader.start()
    env = dict(os.environ, CCSUP_STATE_DIR=str(state_dir), CCSUP_CONFIG=str(d.config))
    script = f"head -c {MB * 750000} /dev/zero | base64 -w 99; exit 3"
    run = subprocess.Popen(
        [*CCSUP, "run", "-t", "--", "sh", "-c", script],
        env=env,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
    )
    os.close(slave)
    try:
        with Client(state_dir) as client:
            wait_until(lambda: client.ps()["slots"], 30, 0.01, "the turn to start")
            os.kill(run.pid, signal.SIGSTOP)
            wait_until(lambda: not client.ps()["slots"], 60, 0.1, "the turn's end (its slot free)")
        os.kill(run.pid, signal.SIGCONT)
        assert run.wait(60) == 3
        wait_until(lambda: seen[0] >= MB * 1_000_000, 10, 0.05, "the client's output")
    finally:
        run.kill()
        run.wait()
        os.close(master)
