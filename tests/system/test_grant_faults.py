"""A slot gate that fails for one key strands nothing of the others, and the tick survives it.

On a real supervisor with a real fault: a slot's lock file replaced by a
symlink (every open of it fails with ELOOP), or a full disk under a new key's first record.
"""

from __future__ import annotations

import os
import signal
import subprocess

from conftest import HELPERS, PYTHON, wait_until

from guardd import procs
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


# -- every periodic duty survives an exception (B3) ----------------------------------------------

DUTIES = (
    "expire_finished",
    "save_state",
    "grant",
    "confirm_ends",
    "reap",
    "prune_logs",
    "trim_memory",
)

# Holds a slot of `key` from outside the supervisor (the gate is a library) until told to release.
HOLD = r"""
import sys
from pathlib import Path
from supervisor.caps import Caps
from supervisor.slots.gate import Holder, SlotGate
gate = SlotGate(Path(sys.argv[1]), Caps(caps={sys.argv[2]: 1}))
slot = gate.try_acquire(sys.argv[2], Holder.this_process(agent="outside"), turn="outside")
print("held" if slot else "busy", flush=True)
sys.stdin.readline()
slot.release()
"""

# Leaves an orphaned slot of `orph`: its holder exits with work (a sleep in a session of its own)
# recorded and still running, so the lock is free and the record unreleased.
ORPHAN = r"""
import os, subprocess, sys
from pathlib import Path
from guardd import procs
from supervisor.caps import Caps
from supervisor.slots.gate import Holder, SlotGate
gate = SlotGate(Path(sys.argv[1]), Caps(caps={"orph": 1}))
work = subprocess.Popen(["sleep", "300"], start_new_session=True)
slot = gate.try_acquire("orph", Holder.this_process(agent="outside"), turn="lost")
group = procs.Group(work.pid, procs.start_ticks(work.pid))
slot.record_work(procs.identity_of(os.getpid()), None, [group])
print(work.pid, flush=True)
"""


def test_each_periodic_duty_survives_an_exception_is_logged_and_counted_and_works_again(
    daemon, event_log, state_dir
):
    runs = state_dir / "runs"
    d = daemon(start=False, caps="codex = 1")
    d.program = [str(HELPERS / "failing_duties.py"), str(runs)]
    d.start()
    log = event_log(d)

    def ran_again() -> bool:
        return runs.exists() and set(DUTIES) <= set(runs.read_text().split())

    wait_until(ran_again, timeout=20, what="every periodic duty to run again after its failure")
    stderr = d.stderr_path.read_text()
    for name in DUTIES:
        assert f"(periodic duty {name}): injected failure of {name}; it runs again" in stderr
    assert f"unable to reap the orphaned slots of {state_dir}/slots" in stderr
    with d.client() as client:
        text = client.call("metrics")["text"]
        for name in DUTIES:
            assert f'ccsup_periodic_errors_total{{task="{name}"}} 1.0' in text, text
        # grant works again: a slot freed by another process is seen only by the periodic retry
        outside = subprocess.Popen(
            [PYTHON, "-c", HOLD, str(state_dir), "codex"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert outside.stdout.readline() == "held\n"
            assert client.turn("codex", ["true"], id="t1")["state"] == "queued"
            outside.stdin.write("release\n")
            outside.stdin.flush()
            assert outside.wait(10) == 0
        finally:
            if outside.poll() is None:
                outside.kill()
                outside.wait()
        log.wait_for("turn.t1.released")
        # reap works again: an orphaned slot left by a dead holder is reaped, its work ended
        orphan = subprocess.run(
            [PYTHON, "-c", ORPHAN, str(state_dir)], capture_output=True, text=True, timeout=20
        )
        work = int(orphan.stdout)
        try:
            log.wait_for("slot.orph.reaped")
            wait_until(lambda: dead(work), what=f"the orphan's work {work} to be ended")
        finally:
            if not dead(work):
                os.kill(work, signal.SIGKILL)
    assert d.stop(timeout=20) == 0


def dead(pid: int) -> bool:
    stat = procs.read_stat(pid)
    return stat is None or stat.zombie
