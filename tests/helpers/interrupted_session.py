"""A pytest session for tests/test_suite_interrupt.py to interrupt (not collected by the suite: its
name is not test_*.py): each test starts a supervisor and a turn, says so by a file in
$CCSUP_READY_DIR, then waits to be interrupted."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest


@pytest.mark.timeout(600)
@pytest.mark.parametrize("n", [0, 1])
def test_a_supervisor_and_a_turn_wait_for_the_interrupt(daemon, event_log, n):
    d = daemon()
    log = event_log(d)
    with d.client() as client:
        client.turn("codex", ["sleep", "600"], id=f"t{n}")
    log.wait_for(f"turn.t{n}.started")
    (Path(os.environ["CCSUP_READY_DIR"]) / str(n)).write_text(str(d.proc.pid))
    time.sleep(600)
