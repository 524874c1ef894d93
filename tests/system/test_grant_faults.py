"""A slot gate that fails for one key strands nothing of the others, and the tick survives it.

Issue 27, B2 and B3, on a real supervisor with a real fault: a slot's lock file replaced by a
symlink (every open of it fails with ELOOP), or a full disk under a new key's first record.
"""

from __future__ import annotations

import os

from supervisor.client.control import RemoteError


def break_lock(state_dir, key: str, index: int = 0):
    """slot-<index>.lock of key replaced by a symlink: opening it (O_NOFOLLOW) fails with ELOOP."""
    lock = state_dir / "slots" / key / f"slot-{index}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    target = state_dir / f"elsewhere-{key}-{index}"
    target.write_text("")
    if lock.exists() or lock.is_symlink():
        lock.unlink()
    lock.symlink_to(target)
    return lock


def repair_lock(lock):
    lock.unlink()
    lock.write_text("")
    os.chmod(lock, 0o600)


def why_of(client, turn_id: str):
    return next(w["why"] for w in client.ps()["waits"] if w["id"] == turn_id)


def test_a_key_whose_lock_is_a_symlink_strands_no_grant_of_another_key(
    daemon, event_log, state_dir
):
    d = daemon(caps="a = 1, b = 1")
    log = event_log(d)
    lock = break_lock(state_dir, "b")
    with d.client() as client:
        client.turn("a", ["sh", "-c", "read line"], id="a1")
        log.wait_for("turn.a1.started")
        assert client.turn("a", ["true"], id="a2")["state"] == "queued"
        # The request that meets the broken key is a success (it waits), never "internal error"
        # for a turn that was queued all the same.
        answer = client.turn("b", ["true"], id="b1")
        assert answer["state"] == "queued"
        error = log.wait_for("supervisor.error")
        assert error["key"] == "b" and str(lock) in error["message"], error
        assert why_of(client, "b1")["reason"] == "unreadable"
        # a1 ends: a2 is granted in the same pass that meets b's error, and it runs.
        client.send("a1", "\n", eof=True)
        log.wait_for("turn.a2.released")
        assert log.find("turn.a2.exited")[0]["code"] == 0
        # Repaired, b's waiter is granted by the periodic retry, with no other request.
        repair_lock(lock)
        log.wait_for("turn.b1.released")
    assert d.stop(timeout=20) == 0


def test_a_request_that_meets_a_broken_gate_is_answered_queued_not_internal_error(
    daemon, event_log, state_dir
):
    d = daemon(caps="b = 1")
    log = event_log(d)
    break_lock(state_dir, "b")
    with d.client() as client:
        try:
            answer = client.turn("b", ["true"], id="b1")
        except RemoteError as e:  # the bug: an error, yet b1 was queued and would run later
            raise AssertionError(f"b1 was answered {e.code}: {e}") from None
        assert answer == {"id": "b1", "state": "queued", "position": 1}
        assert [w["id"] for w in client.ps()["waits"]] == ["b1"]
    assert log.wait_for("supervisor.error")["key"] == "b"
    # A stop with a waiter on a broken key finishes: the waiter is cancelled.
    assert d.stop(timeout=20) == 0
    assert log.find("turn.b1.cancelled")
