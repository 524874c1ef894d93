"""A full disk under the state directory: nothing acknowledged is lost, nothing finished runs again.

Issue 27, B2 (a new key's first slot record meets ENOSPC) and B5 (requests on a full disk, then a
crash). The state directory is a small tmpfs of its own, filled up for real.
"""

from __future__ import annotations

import pytest
from small_disk import full, small_tmpfs


@pytest.fixture
def state_dir():
    """This module's supervisors run on a 2 MiB tmpfs (the daemon fixture stops them first)."""
    with small_tmpfs("2m") as path:
        yield path


def test_a_new_keys_first_slot_record_on_a_full_disk_leaves_it_waiting_then_it_runs(
    daemon, event_log, state_dir
):
    d = daemon(caps="a = 1")
    log = event_log(d)
    with d.client() as client:
        client.turn("a", ["true"], id="a0")  # queue.journal, finished.log: written once already
        log.wait_for("turn.a0.released")
        with full(state_dir):
            # key c has no slot files yet: its first record cannot be written
            answer = client.turn("c", ["true"], id="c1")
            assert answer["state"] == "queued", answer
            error = log.wait_for("supervisor.error")
            assert error["key"] == "c" and "No space left on device" in error["message"], error
            assert "slots/c/slot-0.json" in error["message"], error
            waits = client.ps()["waits"]
            assert [(w["id"], w["why"]["reason"]) for w in waits] == [("c1", "unreadable")]
        # room again: the periodic retry grants c1, and it runs
        log.wait_for("turn.c1.released")
        assert log.find("turn.c1.exited")[0]["code"] == 0
    assert d.stop(timeout=20) == 0
