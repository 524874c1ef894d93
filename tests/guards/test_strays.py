"""Without cgroups, a lost guard's strays never escape: a descendant that left the
turn's group and session and dropped its marker, whose guard then died before its next scan, is
reparented to the guard zygote, ended there, and the slot is released only once it is gone. A guard
started directly (no zygote), or one whose zygote the turn SIGKILLs too, leaves its strays to the
supervisor, a child subreaper as well, which ends them before the guard's exit is handed on."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid

import pytest
from conftest import HELPERS, PYTHON, wait_until, zygote_of

from guardd import procs, scan


def processes_named(token: str) -> list[int]:
    """Live processes named token (their argv[0] after `sh -c`), with all their descendants."""
    found: set[int] = set()
    for pid in procs.all_pids():
        try:
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            continue
        if cmdline.split(b"\0")[3:4] == [token.encode()]:
            found.add(pid)
            found.update(scan.descendants(pid))
    return [p for p in found if (s := procs.read_stat(p)) is not None and not s.zombie]


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        ident = procs.identity_of(pid)
        if ident is not None:
            procs.signal_process(ident, signal.SIGKILL)


def without_cgroups(d):
    """The daemon started with `[guard] cgroup = "off"` (the config's last table is [guard])."""
    d.config.write_text(d.config.read_text() + 'cgroup = "off"\n')
    return d.start()


def started_turns(log) -> list[str]:
    return [t.split(".")[1] for t in log.topics("turn.") if t.endswith(".started")]


def test_the_issues_escapee_that_kills_its_own_guard_is_ended_before_the_next_turn(
    daemon, event_log, state_dir
):
    d = without_cgroups(daemon(start=False, caps="adv = 1", grace="300ms", scan="2s"))
    log = event_log(d)
    token = f"ESC{uuid.uuid4().hex[:8]}"
    # The issue's command, exactly, with its escapee's name made unique.
    command = f"setsid env -i sh -c 'sleep 30; :' {token} & sleep 0.1; kill -9 $PPID; sleep 30"
    run = subprocess.Popen(
        [PYTHON, "-m", "supervisor", "--state-dir", str(state_dir)]
        + ["run", "--key", "adv", "--", "sh", "-c", command],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        (first,) = wait_until(lambda: started_turns(log), what="the first turn started")
        with d.client() as client:
            client.turn("adv", ["sh", "-c", "echo second"], id="t2")
            log.wait_for("turn.t2.started")
            beside = processes_named(token)  # what runs beside the cap-1 second turn
            assert beside == [], f"the escapee runs beside the next turn: {beside}"
            exited = log.wait_for(f"turn.{first}.exited")
            assert exited["code"] is None and exited["reason"] == "guard_lost"
            assert run.wait(15) == 125
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        kill_all(processes_named(token))
    assert d.stop() == 0
    assert processes_named(token) == []


def test_an_outside_sigkill_of_the_guard_holds_the_slot_until_its_stubborn_stray_is_gone(
    daemon, event_log, state_dir
):
    # No scan of the guard sees the stray before the kill.
    d = without_cgroups(daemon(start=False, caps="adv = 1", grace="1s", scan="30s"))
    log = event_log(d)
    pidfile = state_dir / "stray.pid"
    token = f"ESC{uuid.uuid4().hex[:8]}"
    escapee = (
        f"setsid env -i sh -c 'trap \"\" TERM; echo $$ > {pidfile}; sleep 30; :' {token} & "
        "exec sleep 30"
    )
    try:
        with d.client() as client:
            client.turn("adv", ["sh", "-c", escapee], id="t1")
            started = log.wait_for("turn.t1.started")
            stray = int(wait_until(lambda: pidfile.exists() and pidfile.read_text().strip()))
            stray_ident = procs.identity_of(stray)
            assert stray_ident is not None
            client.turn("adv", ["sh", "-c", "echo second"], id="t2")
            killed_at = time.monotonic()
            os.kill(started["guard"]["pid"], signal.SIGKILL)
            log.wait_for("turn.t2.started")
            # It ignores SIGTERM: only the SIGKILL after the grace ended it, and only then the slot
            # went to the second turn.
            assert not procs.process_running(stray_ident), "the stray runs beside the next turn"
            assert log.time_of("turn.t2.started") - killed_at >= 1.0
            assert log.wait_for("turn.t1.exited")["reason"] == "guard_lost"
    finally:
        kill_all(processes_named(token))
    assert d.stop() == 0
    assert processes_named(token) == []


def run_the_issues_escapee(
    d, log, state_dir, *, kill: str, stubborn=False, page=None, innocent=None
) -> int:
    """The issue's command (`kill -9` of what `kill` names, $PPID being the guard and $Z its
    parent), its escapee ignoring SIGTERM if stubborn; then a second cap-1 turn, which must not
    run beside the escapee (nor may the page, if any, have been ended, nor the turn `innocent`,
    which reads a line and echoes it, on another key). The guard's parent's pid, as the turn read
    it."""
    token = f"ESC{uuid.uuid4().hex[:8]}"
    parent = state_dir / "guard-parent"
    trap = """trap '' TERM; """ if stubborn else ""
    command = (
        f"Z=$(awk '{{print $4}}' /proc/$PPID/stat); echo $Z > {parent}; "
        f"setsid env -i sh -c '{trap}sleep 30; :' {token} & sleep 0.1; kill -9 {kill}; sleep 30"
    )
    run = subprocess.Popen(
        [PYTHON, "-m", "supervisor", "--state-dir", str(state_dir)]
        + ["run", "--key", "adv", "--", "sh", "-c", command],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        (first,) = wait_until(
            lambda: [t for t in started_turns(log) if t != innocent], what="the first turn started"
        )
        with d.client() as client:
            client.turn("adv", ["sh", "-c", "echo second"], id="t2")
            log.wait_for("turn.t2.started")
            beside = processes_named(token)  # what runs beside the cap-1 second turn
            assert beside == [], f"the escapee runs beside the next turn: {beside}"
            exited = log.wait_for(f"turn.{first}.exited")
            assert exited["code"] is None and exited["reason"] == "guard_lost"
            assert run.wait(15) == 125
            if page is not None:
                assert procs.process_running(page), "the page was taken for a stray"
            if innocent is not None:
                client.send(innocent, "hi\n", eof=True)
                assert log.wait_for(f"turn.{innocent}.exited")["code"] == 0
                assert client.read_log(innocent, "stdout") == b"got hi\n"
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        kill_all(processes_named(token))
    assert d.stop() == 0
    assert processes_named(token) == []
    return int(parent.read_text())


def page_of(daemon_pid: int) -> procs.Identity | None:
    """The daemon's child that serves the page (`ccsup web --exit-with-parent`)."""
    for child in scan.children_of(daemon_pid):
        try:
            cmdline = open(f"/proc/{child}/cmdline", "rb").read()
        except OSError:
            continue
        if b"--exit-with-parent" in cmdline.split(b"\0"):
            return procs.identity_of(child)
    return None


def test_a_directly_started_guards_escapee_is_ended_by_the_supervisor_before_the_next_turn(
    daemon, event_log, state_dir
):
    """The page beside it, a child of the supervisor in a session of its own, is no stray: it
    runs on."""
    web = '[web]\nlisten = "127.0.0.1:0"\n'
    d = daemon(start=False, caps="adv = 1", grace="300ms", scan="2s", extra=web)
    d.program = [str(HELPERS / "no_zygote.py")]  # every guard is started directly
    d = without_cgroups(d)
    log = event_log(d)
    page = wait_until(lambda: page_of(d.proc.pid), what="the page started beside the daemon")
    daemon_pid = d.proc.pid
    assert run_the_issues_escapee(d, log, state_dir, kill="$PPID", page=page) == daemon_pid


@pytest.mark.parametrize("kill", ["$PPID $Z", "$Z $PPID"], ids=["guard-first", "zygote-first"])
def test_a_turn_that_kills_its_guard_and_the_zygote_leaves_no_stray_beside_the_next_turn(
    daemon, event_log, state_dir, kill
):
    """Its escapee ignores SIGTERM: whatever the zygote did before it died, only the supervisor's
    SIGKILL after the grace ends it, and only then does the slot go to the second turn. Another
    key's turn, whose guard the same zygote forked, runs on to its normal end."""
    d = daemon(start=False, caps="adv = 1, other = 1", grace="500ms", scan="30s")
    d = without_cgroups(d)
    log = event_log(d)
    zygote = zygote_of(d.proc.pid)
    with d.client() as client:  # forked by the same zygote: its guard is no stray once it dies
        client.turn("other", ["sh", "-c", "read x; echo got $x"], id="inn")
    log.wait_for("turn.inn.started")
    ran = run_the_issues_escapee(d, log, state_dir, kill=kill, stubborn=True, innocent="inn")
    assert ran == zygote
