"""A turn granted whose guard had not started when its supervisor was SIGKILLed runs after the
restart (issue 32, item 1): held at its key's head (supervisor.turns.rerun), asked for again by
its living requester (`ccsup run`, Client.run_turn) by the same id, it runs once, and the
requester gets its whole output and its own status; without a living requester, or one that does
not ask again in time, it ends `supervisor_restarted` and says why.

The moment is caught by the supervisor itself: tests/helpers/killed_at.py granted SIGKILLs it
the instant it has published a turn's `granted`, before the turn's guard is asked for (the grant
is saved and published first). So the turn never started, every time, and nothing sleeps. Either
the turn waits first (a blocker holds the key's one slot; its own grant is marked done
beforehand), so its requester has its answer (`queued`) and the grant comes when the blocker is
cancelled, as a slot freeing up grants a waiter; or it is granted at once, and its supervisor
dies before it answers the request (the requester sends it again by its id)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest
from conftest import HELPERS, wait_until

from supervisor.client import Client, TurnOutput
from supervisor.history import db as history
from supervisor.turns.store import read_queue

CCSUP = [sys.executable, "-m", "supervisor"]
LINES = 3000
GONE = "is gone; waiting up to"
BACK = "a supervisor answers again"


def killed_at_granted(daemon, state_dir, blocker: bool = True, **config):
    """A supervisor that dies at the first grant of a turn other than `blocker`, which holds the
    key's one slot (its stdin open: it waits) once this returns (without it, at the first)."""
    d = daemon(caps="codex = 1", start=False, **config)
    (state_dir / "killed").write_text("blocker\n" if blocker else "")
    d.program = [str(HELPERS / "killed_at.py"), "granted", str(state_dir / "killed")]
    d.start()
    d.blocker = blocker
    if blocker:
        with d.client() as client:
            assert client.turn("codex", ["sh", "-c", "read x"], id="blocker")["state"] == "granted"
    return d


def free_the_slot_once_waiting(d, turn_id: str | None = None) -> str | None:
    """Once a turn waits behind the blocker, cancel the blocker: the waiter is granted, and the
    supervisor dies at once. Returns the waiter's id (None without a blocker: nothing to do)."""
    if not d.blocker:
        return turn_id

    def waiting() -> str | None:
        with d.client() as client:
            waits = client.ps()["waits"]
        return next((w["id"] for w in waits if turn_id in (None, w["id"])), None)

    waiter = wait_until(waiting, 30, what="a turn waiting behind the blocker")
    with d.client() as client:
        client.cancel("blocker")
    return waiter


def killed_turn(state_dir) -> str:
    return (state_dir / "killed").read_text().split()[-1]


def ran_once(path) -> bool:
    return path.read_text() == "ran\n"


def the_story(state_dir, turn_id: str) -> dict:
    try:
        return history.show(state_dir, turn_id) or {}
    except history.HistoryError:
        return {}


def released(state_dir, turn_id: str) -> dict:
    return wait_until(
        lambda: (s := the_story(state_dir, turn_id)).get("state") == "released" and s,
        60,
        what=f"turn {turn_id} released in the history",
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("waited", [True, False], ids=["waited", "at_once"])
def test_ccsup_run_of_a_turn_granted_not_started_at_a_sigkill_runs_after_the_restart(
    daemon, state_dir, waited
):
    """`ccsup run` rides through, asks again, and exits with the command's own status; its
    stdin (a pipe, read by the command) and its stdout arrive whole; the command ran once."""
    d = killed_at_granted(daemon, state_dir, blocker=waited, adopt_within="30s")
    ran = state_dir / "ran"
    cmd = f'echo ran >> {ran}; read line; echo "got $line"; seq 1 {LINES}; exit 7'
    out, err, inp = state_dir / "run.out", state_dir / "run.err", state_dir / "run.in"
    inp.write_text("hello\n")
    env = dict(os.environ, CCSUP_STATE_DIR=str(state_dir), CCSUP_CONFIG=str(d.config))
    with open(inp, "rb") as stdin, open(out, "wb") as stdout, open(err, "wb") as stderr:
        run = subprocess.Popen(
            [*CCSUP, "run", "--notices", "--key", "codex", "--", "sh", "-c", cmd],
            env=env,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
        )
    try:
        free_the_slot_once_waiting(d)
        assert d.proc.wait(60) == -signal.SIGKILL  # the moment `granted` was published
        assert not ran.exists()  # its guard was never asked for
        if waited:  # (at once: its request is not answered, and it asks again, saying nothing)
            wait_until(lambda: GONE in err.read_text(), 20, what="ccsup run saying it waits")
        d.start()
        code = run.wait(60)
    finally:
        run.kill()
        run.wait()
    text = err.read_text()
    assert code == 7, text
    expected = "got hello\n" + "".join(f"{i}\n" for i in range(1, LINES + 1))
    assert out.read_text() == expected, text
    assert (BACK in text) is waited and ran_once(ran)
    turn_id = killed_turn(state_dir)
    story = released(state_dir, turn_id)
    assert (story["exit_code"], story["outcome"]) == (7, "exit")
    kinds = [e["kind"] for e in story["events"]]
    assert kinds.count("started") == 1 and kinds[-3:] == ["exited", "gone", "released"], kinds


@pytest.mark.timeout(120)
@pytest.mark.parametrize("waited", [True, False], ids=["waited", "at_once"])
def test_run_turn_of_a_turn_granted_not_started_at_a_sigkill_runs_after_the_restart(
    daemon, state_dir, waited
):
    """Client.run_turn asks again by the same id and yields the turn's whole story there."""
    d = killed_at_granted(daemon, state_dir, blocker=waited, adopt_within="30s")
    ran = state_dir / "ran"

    def start_again() -> None:
        free_the_slot_once_waiting(d, "again")
        assert d.proc.wait(60) == -signal.SIGKILL
        d.start()

    restart = threading.Thread(target=start_again)
    restart.start()
    events, got = [], b""
    cmd = f"echo ran >> {ran}; seq 1 {LINES}; exit 3"
    try:
        with Client(state_dir) as client:
            output = TurnOutput("again", fill=lambda s, a, b: client.read_log("again", s, a, b))
            for topic, body in client.run_turn(
                "codex", ["sh", "-c", cmd], id="again", stdin="null"
            ):
                events.append((topic, body))
                chunk = output.feed(topic, body)
                if chunk is not None and chunk[0] == "stdout":
                    got += chunk[1]
    finally:
        restart.join(60)
    assert got == "".join(f"{i}\n" for i in range(1, LINES + 1)).encode(), [
        t for t, _ in events if not t.endswith("out")
    ]
    kinds = [topic.rsplit(".", 1)[-1] for topic, _ in events if not topic.endswith(".stdout")]
    assert kinds[-4:] == ["started", "exited", "gone", "released"], kinds
    exited = next(body for topic, body in events if topic.endswith(".exited"))
    assert (exited["code"], exited["reason"]) == (3, None)
    assert ran_once(ran)


@pytest.mark.timeout(120)
def test_a_turn_granted_not_started_whose_requester_died_ends_saying_so(daemon, state_dir):
    """Its requester (a `ccsup run`) SIGKILLed during the gap: the turn is not run; it ends
    `supervisor_restarted`, and its `exited` and `ccsup show` say why."""
    d = killed_at_granted(daemon, state_dir, adopt_within="30s")
    ran = state_dir / "ran"
    env = dict(os.environ, CCSUP_STATE_DIR=str(state_dir), CCSUP_CONFIG=str(d.config))
    run = subprocess.Popen(
        [*CCSUP, "run", "--key", "codex", "--", "sh", "-c", f"echo ran >> {ran}"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        turn_id = free_the_slot_once_waiting(d)
        assert d.proc.wait(60) == -signal.SIGKILL
    finally:
        run.kill()
        run.wait()
    d.start()
    assert turn_id is not None
    story = released(state_dir, turn_id)
    assert (story["outcome"], story["reason"]) == ("supervisor_restarted", "supervisor_restarted")
    exited = next(e["body"] for e in story["events"] if e["kind"] == "exited")
    assert exited["detail"] == (
        "its guard had not started when its supervisor died, and its requester is gone"
    )
    shown = subprocess.run(
        [*CCSUP, "show", turn_id], env=env, capture_output=True, text=True, timeout=30
    )
    assert "its requester is gone" in shown.stdout, shown.stdout + shown.stderr
    assert not ran.exists()
    with open(state_dir / "killed", "a") as marks:
        marks.write("next\n")  # its grant is not one to die at
    with d.client() as client:  # the key is free again: its next turn runs at once
        assert client.turn("codex", ["true"], id="next", stdin="null")["state"] == "granted"


@pytest.mark.timeout(120)
def test_a_turn_granted_not_started_not_asked_again_in_time_ends_saying_so(daemon, state_dir):
    """A living requester that does not ask again (a plain `turn` request, no ride-through):
    held adopt_within + 5 s, shown held in `ps`, then ended `supervisor_restarted` with why."""
    d = killed_at_granted(daemon, state_dir, adopt_within="1s")
    with d.client() as client:
        client.turn("codex", ["true"], id="quiet", stdin="null")
    free_the_slot_once_waiting(d, "quiet")
    assert d.proc.wait(60) == -signal.SIGKILL
    d.start()
    with d.client() as client:
        waits = client.ps()["waits"]
    assert [(w["id"], w["why"]["reason"]) for w in waits] == [("quiet", "requester")], waits
    assert waits[0]["held_until"] > 0
    story = released(state_dir, "quiet")
    exited = next(e["body"] for e in story["events"] if e["kind"] == "exited")
    assert exited["reason"] == "supervisor_restarted"
    assert exited["detail"].endswith("its requester did not ask for it again in time")
    queue = read_queue(state_dir / "queue.json")
    assert not any(e["id"] == "quiet" for e in queue["running"] + queue["waiting"])
