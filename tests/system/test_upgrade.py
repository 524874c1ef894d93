"""Upgrades from the release before: the commit before adoption, installed
into a venv of its own (tests/helpers/old_release.py), runs a supervisor with turns finished,
running and waiting and a reservation held; it is SIGKILLed (or stopped), and this tree's
supervisor starts on the same state directory.

That release has no adoption: its guards end their turns when their supervisor goes (reason
`parent_gone`). So the new supervisor adopts nothing of it; what it must do is start cleanly on
its state (queue.json's older entries, finished ids, slot and guard records, a history of schema
version 1), run the waiting turns it acknowledged, each once and in order, keep its reservation,
never rerun a finished id, count the old guard that still ends its work (its slot is not handed
out while it lives) and end each old running turn's story once (`supervisor_restarted`). And this release's `ccsup
restart` asked of that supervisor (pip install -U, then restart) refuses and changes nothing.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
from cli_daemon import ccsup
from conftest import MARKER, RunningDaemon, remove_supervisor_cgroups, wait_until
from old_release import OldRelease, venv_of

from guardd import procs
from supervisor.history import db as history_db

OLD_COMMIT = "7b3474a"  # the release before adoption

# Old and new read the same config: nothing in it that the old release does not know. A grace
# long enough that the new supervisor starts while the old guard still ends its TERM-proof turn.
CONFIG = '[slots]\ncaps = { codex = 1, claude = 1 }\n[guard]\ngrace = "3s"\nscan = "200ms"\n'
# Ignores SIGTERM: only the old guard's SIGKILL, a grace after its supervisor went, ends it.
RUNNING = "trap '' TERM; echo r1 up; while :; do sleep 0.05; done"
WAITING = ["w1", "w2", "w3"]


@pytest.fixture(scope="session")
def old_venv() -> Path:
    began = time.monotonic()
    venv = venv_of(OLD_COMMIT)
    print(f"old release venv: {venv} ({time.monotonic() - began:.1f} s)")
    return venv


def _log(state_dir: Path, turn: str) -> bytes:
    try:
        return (state_dir / "turns" / turn / "stdout.log").read_bytes()
    except FileNotFoundError:
        return b""


def _story(state_dir: Path, turn: str) -> dict:
    shown = ccsup("show", "--json", turn, state_dir=state_dir)
    return json.loads(shown.stdout) if shown.returncode == 0 else {}


def _released(state_dir: Path, turn: str) -> dict:
    return wait_until(
        lambda: (s := _story(state_dir, turn)).get("state") == "released" and s,
        30,
        0.1,
        f"turn {turn} released in the history",
    )


def _turn_processes(turn: str) -> list[int]:
    """This test's processes of the turn (a parallel test's turns may have the same id)."""
    ours = {MARKER: os.environ[MARKER]}
    return [i.pid for i in procs.processes_with_env("CCSUP_TURN", turn, also=ours)]


class OldState:
    """The old release's supervisor with its turns, for a test to end it and start the new one."""

    def __init__(self, old: OldRelease, proc: subprocess.Popen, started: list[RunningDaemon]):
        self.old, self.proc, self._started = old, proc, started
        self.guard = procs.Identity(0, 0)  # r1's guard, once it runs
        self.cgroup: str | None = None  # r1's cgroup (the old guard's record says)

    def new(self) -> RunningDaemon:
        """This tree's supervisor on the same state directory and config (not started)."""
        self._started.append(RunningDaemon(self.old.state_dir, self.old.config))
        return self._started[-1]


@pytest.fixture
def old_state(old_venv, state_dir, tmp_path):
    """The old release's supervisor on state_dir: f1 and f2 finished, r1 running (cap 1), w1-w3
    waiting behind it (each appends its id to tmp_path/order), res1 held on claude for a live
    requester. Everything it started is ended by pid afterwards, the new supervisor too."""
    config = state_dir / "ccsup.toml"
    config.write_text(CONFIG)
    (state_dir / "no-config").mkdir()
    old = OldRelease(old_venv, state_dir, config)
    order = tmp_path / "order"
    requester = subprocess.Popen(["sleep", "300"])  # the reservation's, alive throughout
    proc = old.start_foreground(state_dir / "old.stderr")
    started: list[RunningDaemon] = []
    try:
        wait_until(lambda: old.ccsup("status").returncode == 0, 30, 0.1, "the old supervisor")
        me = procs.identity_of(requester.pid)
        assert me is not None
        state = OldState(old, proc, started)
        for turn in ("f1", "f2"):
            old.call("turn", key="codex", argv=["sh", "-c", f"echo {turn}"], id=turn, holder={})
        for turn in ("f1", "f2"):
            wait_until(lambda t=turn: _old_state_of(old, t) == "released", 30, 0.1, turn)
        old.call("turn", key="codex", argv=["sh", "-c", RUNNING], id="r1", holder={})
        wait_until(lambda: _log(state_dir, "r1") == b"r1 up\n", 30, 0.05, "r1 running")
        for turn in WAITING:
            command = f"echo {turn}; echo {turn} >> {order}"
            old.call("turn", key="codex", argv=["sh", "-c", command], id=turn, holder={})
        held = old.call("reserve", key="claude", id="res1", holder=me.to_json())
        assert held["state"] == "held", held
        state.guard, state.cgroup = _guard_of(state_dir, "r1")
        if spawn := sorted(old_venv.glob("lib/python*/site-packages/guardd/_spawn*.so")):
            # The old release's own guard, not this tree's: its C spawner is the old venv's.
            assert str(spawn[0]) in Path(f"/proc/{state.guard.pid}/maps").read_text()
        yield state
    finally:
        for p in (proc, *(d.proc for d in started)):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        requester.kill()
        requester.wait()
        for p in (proc, *(d.proc for d in started)):
            if p is not None:
                remove_supervisor_cgroups(p.pid)


def _old_state_of(old: OldRelease, turn: str) -> str | None:
    shown = old.ccsup("show", "--json", turn)
    return json.loads(shown.stdout).get("state") if shown.returncode == 0 else None


# 300 s: the first test of a run may build the old venv (about 40 s, cached after).
@pytest.mark.timeout(300)
def test_after_a_crash_of_the_release_before_the_new_supervisor_runs_what_it_acknowledged(
    old_state, state_dir, tmp_path
):
    old_guard = old_state.guard
    old_state.proc.send_signal(signal.SIGKILL)  # as the OOM killer or a crash would
    old_state.proc.wait()
    # Its guard ends r1 itself (SIGTERM, then SIGKILL a grace later): not over yet.
    assert procs.process_running(old_guard)
    new = old_state.new().start()
    assert ccsup("status", state_dir=state_dir).returncode == 0
    shown_ps = ccsup("ps", state_dir=state_dir)
    assert shown_ps.returncode == 0, shown_ps.stderr
    order = tmp_path / "order"
    with new.client() as client:
        status = client.status()
        # A release without adoption left nothing to adopt, and no guard of it waits.
        assert (status["adopted"], status["waiting_adoption"]) == (0, 0), status
        assert status["reservations"] == 1, status
        slots = client.ps()["slots"]
        if procs.process_running(old_guard):
            # The old guard still ends its turn: its slot is counted (the lock is the old
            # guard's), not handed out, and nothing waiting has started.
            slot = next(s for s in slots if s["key"] == "codex")
            assert slot["state"] in ("held", "orphaned"), json.dumps(slot)
            assert slot["turn"] == "r1" and slot["pid"] == old_guard.pid, json.dumps(slot)
            assert not order.exists()
    # The reservation the old one granted is held again, for its requester.
    reserved = [s for s in slots if s["key"] == "claude"]
    assert [s["state"] for s in reserved] == ["reserved"], json.dumps(reserved)
    # The waiting turns run under the new code, in order, each once.
    for turn in WAITING:
        story = _released(state_dir, turn)
        assert story["outcome"] == "ok", story
        assert _log(state_dir, turn) == f"{turn}\n".encode()
    assert order.read_text() == "".join(f"{t}\n" for t in WAITING)
    assert not _turn_processes("r1") and not procs.process_running(old_guard)
    # The old running turn's story ends once, as a lost one.
    r1 = _released(state_dir, "r1")
    assert [e["kind"] for e in r1["events"]].count("exited") == 1, r1["events"]
    assert r1["reason"] == "supervisor_restarted" and r1["outcome"] == "supervisor_restarted", r1
    # A finished id asked again (a client retrying, the new one's and the old one's) is
    # answered as finished, never run again.
    with new.client() as client:
        again = client.turn("codex", ["sh", "-c", "echo again"], id="f1")
    assert again["state"] == "released", again
    again = old_state.old.call("turn", key="codex", argv=["sh", "-c", "echo again"], id="f2")
    assert again["state"] == "released", again
    assert _log(state_dir, "f1") == b"f1\n" and _log(state_dir, "f2") == b"f2\n"
    # The old release's `ccsup run` (a client not upgraded yet) works against the new one.
    ran = old_state.old.ccsup("run", "--key", "codex", "--", "sh", "-c", "echo old; exit 3")
    assert (ran.returncode, ran.stdout) == (3, "old\n"), ran.stderr
    _history_holds_both(state_dir, {"f1", "f2", "r1", *WAITING})
    if old_state.cgroup:  # r1's cgroup, and the old supervisor's parent once empty, removed
        parent = os.path.dirname(old_state.cgroup)
        wait_until(lambda: not os.path.exists(parent), 10, 0.1, f"{parent} removed")
    assert new.stop() == 0


@pytest.mark.timeout(300)
def test_after_a_stop_of_the_release_before_the_new_supervisor_starts_on_its_state(
    old_state, state_dir, tmp_path
):
    stopped = old_state.old.ccsup("stop", "--timeout", "20")
    assert stopped.returncode == 0, stopped.stderr
    old_state.proc.wait(20)
    new = old_state.new().start()
    with new.client() as client:
        status = client.status()
    # `stop` kept its meaning in that release: everything ended, the waiters cancelled, the
    # reservation released; nothing of it comes back, nor runs twice.
    assert (status["turns"], status["waits"], status["reservations"]) == (0, 0, 0), status
    r1 = _story(state_dir, "r1")
    assert (r1["state"], r1["reason"]) == ("released", "shutdown"), r1
    for turn in WAITING:
        story = _story(state_dir, turn)
        assert (story["state"], story["reason"]) == ("cancelled", "shutdown"), story
        with new.client() as client:
            again = client.turn("codex", ["sh", "-c", "echo again"], id=turn)
        assert again["state"] == "cancelled", again
    assert not (tmp_path / "order").exists()
    # The new code runs new turns on the old state.
    with new.client() as client:
        client.turn("codex", ["sh", "-c", "echo n1"], id="n1")
    assert _released(state_dir, "n1")["outcome"] == "ok"
    assert _log(state_dir, "n1") == b"n1\n"
    _history_holds_both(state_dir, {"f1", "f2", "r1", *WAITING, "n1"})
    assert new.stop() == 0


def _history_holds_both(state_dir: Path, ids: set[str]) -> None:
    """The history, of the old release's schema (version 1) migrated to this one's, holds the old
    release's turns and the new one's."""
    listed = ccsup("history", "--json", state_dir=state_dir)
    assert listed.returncode == 0, listed.stderr
    found = {t["id"] for t in json.loads(listed.stdout)}
    assert ids <= found, found
    with sqlite3.connect(state_dir / "history.sqlite") as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == history_db.SCHEMA_VERSION


def _guard_of(state_dir: Path, turn: str) -> tuple[procs.Identity, str | None]:
    for path in (state_dir / "guards").glob("*.json"):
        data = json.loads(path.read_text())
        if data.get("turn") == turn:
            assert "channel" not in data  # the release before: no adoption
            return procs.Identity(data["guard"]["pid"], data["guard"]["start"]), data["cgroup"]
    raise AssertionError(f"no guard record of {turn}")


@pytest.mark.timeout(300)
def test_restart_asked_of_the_release_before_changes_nothing_and_says_why(old_state, state_dir):
    # `pip install -U ccsup`, then `ccsup restart`: the new command meets the old supervisor.
    restarted = ccsup("restart", "--timeout", "5s", state_dir=state_dir)
    assert restarted.returncode == 1, restarted.stderr
    assert "is of a release that cannot hand its turns over: nothing was changed" in (
        restarted.stderr
    ), restarted.stderr
    # Nothing changed: the old one runs on, its turn too, and no second supervisor was left.
    assert old_state.proc.poll() is None and procs.process_running(old_state.guard)
    assert _log(state_dir, "r1") == b"r1 up\n"
    assert old_state.old.call("status")["pid"] == old_state.proc.pid
