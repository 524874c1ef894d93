"""A full disk under the state directory: nothing acknowledged is lost, nothing finished runs again.

A new key's first slot record meets ENOSPC; requests on a full disk, then a
crash. The state directory is a small tmpfs of its own, filled up for real.
"""

from __future__ import annotations

import pytest
from conftest import wait_until
from small_disk import full, small_tmpfs

from supervisor.client.control import RemoteError


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


def ran(witness) -> list[str]:
    return witness.read_text().split() if witness.exists() else []


def test_on_a_full_disk_what_is_acknowledged_runs_once_across_a_crash_and_the_rest_is_refused(
    daemon, event_log, state_dir, tmp_path
):
    """The issue's run: a blocker and 3 waiters (with env), the disk filled, 40 more asked, a
    SIGKILL, the disk freed, a restart: every acknowledged turn runs exactly once, no refused one
    ever does (each refusal is no_space, naming the file, and published nothing), and the blocker
    is not run again. (What a full disk does to grants and ends is in
    tests/turns/test_restore_logic.py: a guard started on a full disk may fail on its own.)"""
    witness = tmp_path / "ran"  # off the small disk, so writing it never fails

    def job(name: str) -> list[str]:
        return ["sh", "-c", f"echo {name} >> {witness}"]

    d = daemon(caps="codex = 1")
    log = event_log(d)
    acknowledged: list[str] = []
    refused: list[str] = []
    with d.client() as client:
        client.turn("codex", ["sh", "-c", f"echo block >> {witness}; sleep 300"], id="block")
        log.wait_for("turn.block.started")
        for n in range(3):
            client.turn("codex", job(f"w{n}"), id=f"w{n}", env={"TOKEN": f"secret{n}"})
            acknowledged.append(f"w{n}")
        with full(state_dir):
            for n in range(40):
                try:
                    client.turn("codex", job(f"n{n}"), id=f"n{n}")
                except RemoteError as e:
                    assert e.code == "no_space", e
                    assert f"unable to save turn n{n} in {state_dir}/queue." in str(e), e
                    refused.append(f"n{n}")
                else:
                    acknowledged.append(f"n{n}")
            assert len(refused) > 20, refused  # the journal's last page took a few
            waits = [w["id"] for w in client.ps()["waits"]]
            assert waits == acknowledged, (waits, acknowledged)
            d.kill()
            assert not any(log.find(f"turn.{i}.queued") for i in refused)  # nothing published
    d.start()
    wait_until(
        lambda: set(ran(witness)) >= {"block", *acknowledged},
        timeout=40,
        what=f"every acknowledged turn to run: {acknowledged}, ran {ran(witness)}",
    )
    with d.client() as client:
        wait_until(lambda: client.status()["waits"] == 0 and client.status()["turns"] == 0)
    assert sorted(ran(witness)) == sorted(["block", *acknowledged])  # once each, no refused one
    assert d.stop(timeout=20) == 0


def history_rows(state_dir) -> dict[str, str | None]:
    """id -> outcome of every turn in the history file (read-only, as `ccsup history` reads it)."""
    import sqlite3

    path = state_dir / "history.sqlite"
    if not path.exists():
        return {}
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    try:
        return dict(db.execute("SELECT id, outcome FROM turns").fetchall())
    except sqlite3.Error:
        return {}
    finally:
        db.close()


def test_a_full_disk_at_start_keeps_the_history_which_catches_up_once_room_is_back(
    daemon, event_log, state_dir
):
    """The history is healthy; the supervisor restarts on a full disk: the file stays where it is
    (not taken for corrupt and moved aside), the trouble is said once, and once room is back the
    turns that ended meanwhile are in it, beside the ones before."""
    d = daemon(caps="a = 1")
    with d.client() as client:
        client.turn("a", ["true"], id="before")
        wait_until(lambda: history_rows(state_dir).get("before") == "ok", 15, 0.05)
    assert d.stop(timeout=20) == 0
    with full(state_dir):
        d.start()
        log = event_log(d)
        with d.client() as client:
            client.turn("a", ["true"], id="meanwhile")
            log.wait_for("turn.meanwhile.released")
        # nothing taken for corrupt and moved aside: history.sqlite.corrupt-*, queue.json.bad-*,
        # finished.log.bad-*, admission.json.bad-*
        aside = [p.name for p in state_dir.iterdir() if ".corrupt" in p.name or ".bad-" in p.name]
        assert aside == []
        assert (state_dir / "history.sqlite").stat().st_size > 0  # where it was
    wait_until(
        lambda: history_rows(state_dir) == {"before": "ok", "meanwhile": "ok"},
        30,
        0.1,
        "the history to catch up once room is back",
    )
    said = [line for line in d.stderr_path.read_text().splitlines() if "history" in line]
    assert len([line for line in said if "full" in line]) == 1, said
    assert not [line for line in said if "corrupt" in line or "unreadable" in line], said
    assert d.stop(timeout=20) == 0
