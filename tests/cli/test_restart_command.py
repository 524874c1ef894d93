"""`ccsup restart`, the planned hand-over: the running supervisor saves
everything and exits without ending a turn (`quit {"handover": true}`, SIGUSR2), and a new one,
started as `ccsup start` would, adopts the turns. Real supervisors, guards and commands; every
process is found and checked by pid (and start time)."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest
from cli_daemon import CCSUP, ccsup
from conftest import wait_until

from guardd import procs
from supervisor.client import Client
from supervisor.instance import lock_held
from supervisor.turns import store

# Prints its pid, then a counter every 50 ms until the go file exists; then exits 0.
COUNTER = (
    'echo "pid $$"; i=0; while [ ! -e "$1" ]; do echo "$i"; i=$((i+1)); sleep 0.05; done; '
    'echo "done $i"'
)
IDS = ("r0", "r1", "r2")


def _config(adopt_within: str, cap: int) -> str:
    return (
        f'[slots]\ncaps = {{ t = {cap} }}\n[guard]\ngrace = "300ms"\nscan = "200ms"\n'
        f'adopt_within = "{adopt_within}"\n'
    )


@pytest.fixture(name="supervisor")
def supervisor_fixture(state_dir):
    """supervisor(adopt_within, cap) -> state_dir with a supervisor started by `ccsup start`;
    after the test, whichever supervisor runs there is stopped, and each one seen is killed by
    pid if it is still there."""
    seen: list[procs.Identity] = []

    def start(adopt_within: str, cap: int = 3):
        (state_dir / "ccsup.toml").write_text(_config(adopt_within, cap))
        started = ccsup("start", state_dir=state_dir)
        assert started.returncode == 0, started.stderr
        with Client(state_dir) as client:
            ident = procs.identity_of(client.status()["pid"])
        assert ident is not None
        seen.append(ident)
        return state_dir

    def note(pid: int) -> None:
        ident = procs.identity_of(pid)
        if ident is not None:
            seen.append(ident)

    start.note = note  # type: ignore[attr-defined]
    yield start
    if seen:
        ccsup("stop", "--timeout", "20", state_dir=state_dir)
    _end_by_pid(*seen)


def _log(state_dir, turn_id: str, stream: str = "stdout") -> bytes:
    try:
        return (state_dir / "turns" / turn_id / f"{stream}.log").read_bytes()
    except FileNotFoundError:
        return b""


def _start_counters(client: Client, state_dir, go) -> dict[str, procs.Identity]:
    """Three counting turns running; each one's CMD (by the pid it printed first)."""
    for turn_id in IDS:
        client.turn("t", ["sh", "-c", COUNTER, "counter", str(go)], id=turn_id)
    wait_until(
        lambda: all(_log(state_dir, t).count(b"\n") >= 4 for t in IDS), 20, 0.02, "three counters"
    )
    commands = {}
    for turn_id in IDS:
        first = _log(state_dir, turn_id).split(b"\n", 1)[0]
        ident = procs.identity_of(int(first.split()[1]))
        assert ident is not None
        commands[turn_id] = ident
    return commands


def _guards(client: Client) -> dict[str, procs.Identity]:
    """Each held slot's turn -> its guard (pid and start, from the slot record)."""
    found = {}
    for slot in client.ps()["slots"]:
        if slot["state"] == "held" and slot.get("pid"):  # (no pid: its guard is starting)
            ident = procs.identity_of(slot["pid"])
            if ident is not None:
                found[slot["turn"]] = ident
    return found


def _end_by_pid(*idents: procs.Identity) -> None:
    for ident in idents:
        if procs.process_running(ident):
            procs.signal_process(ident, signal.SIGKILL)


@pytest.mark.timeout(90)
def test_a_hand_over_exits_leaving_every_guard_and_command_running_with_offsets_saved(
    supervisor, tmp_path
):
    # adopt_within 3 s: nobody adopts here, so the guards then end their work themselves.
    state_dir = supervisor("3s")
    go = tmp_path / "go"
    with Client(state_dir) as client:
        old = procs.identity_of(client.status()["pid"])
        assert old is not None
        with client.subscribe(["turn.", "supervisor."]) as sub:
            commands = _start_counters(client, state_dir, go)
            guards = _guards(client)
            assert set(guards) == set(IDS)
            answer = client.quit(handover=True)
            assert {k: v for k, v in answer.items() if k != "ids"} == {
                "stopping": True,
                "handover": True,
                "pid": old.pid,
                "turns": 3,
                "ending": 0,
                "waiting": 0,
                "adopt_within": 3.0,
            }
            assert sorted(answer["ids"]) == sorted(IDS)
            wait_until(lambda: not procs.process_running(old), 20, 0.01, "the old supervisor")
            events = []
            while (event := sub.recv(timeout=1.0)) is not None:
                events.append(event)
    try:
        assert not lock_held(state_dir / "supervisor.lock")
        # Every guard and every command still runs, by pid and start time.
        for turn_id in IDS:
            assert procs.process_running(guards[turn_id]), turn_id
            assert procs.process_running(commands[turn_id]), turn_id
        stopping = [b for t, b in events if t == "supervisor.stopping"]
        assert [b["handover"] for b in stopping] == [True]
        ended = ("exited", "stopping", "gone", "released", "cancelled")
        assert not [t for t, _ in events if t.startswith("turn.") and t.split(".")[-1] in ended]
        # queue.json: each turn still `running`, with the offsets published so far, exactly.
        saved = {e["id"]: e for e in store.read_queue(state_dir / "queue.json")["running"]}
        assert set(saved) == set(IDS)
        for turn_id in IDS:
            published = [b for t, b in events if t == f"turn.{turn_id}.stdout"]
            end = published[-1]["offset"] + len(published[-1]["data"].encode())
            assert saved[turn_id]["offsets"] == {"stdout": end, "stderr": 0}, turn_id
            assert b"".join(b["data"].encode() for b in published) == _log(state_dir, turn_id)[:end]
        # Nobody adopts them: after adopt_within (and the grace) each guard ends its work.
        wait_until(
            lambda: (
                not any(procs.process_running(i) for i in [*guards.values(), *commands.values()])
            ),
            15,
            0.05,
            "the unadopted guards to end their work",
        )
    finally:
        go.touch()
        _end_by_pid(*commands.values(), *guards.values())


@pytest.mark.timeout(60)
def test_restart_is_refused_when_adopt_within_is_0_and_nothing_changes(supervisor, tmp_path):
    state_dir = supervisor("0s", cap=1)
    go = tmp_path / "go"
    with Client(state_dir) as client:
        before = client.status()["pid"]
        client.turn("t", ["sh", "-c", COUNTER, "counter", str(go)], id="r0")
        wait_until(lambda: _log(state_dir, "r0").count(b"\n") >= 2, 20, 0.02, "the counter")
        refused = ccsup("restart", state_dir=state_dir)
        assert refused.returncode == 1
        assert "restart needs [guard] adopt_within > 0" in refused.stderr, refused.stderr
        assert refused.stdout == ""
        status = client.status()
        assert (status["pid"], status["turns"], status["stopping"]) == (before, 1, False)
        # it still takes new turns: nothing was stopped
        assert client.turn("t", ["true"], id="after")["state"] == "queued"
        go.touch()


def test_restart_without_a_supervisor_exits_3_and_starts_none(state_dir):
    done = ccsup("restart", state_dir=state_dir)
    assert done.returncode == 3
    assert done.stderr == (
        f"ccsup: no supervisor is running on {state_dir}; start one with `ccsup start`\n"
    )
    assert not lock_held(state_dir / "supervisor.lock")


@pytest.mark.timeout(120)
def test_restart_hands_three_running_turns_to_a_new_supervisor_that_adopts_them(
    supervisor, tmp_path
):
    state_dir = supervisor("20s")
    go = tmp_path / "go"
    base = [*CCSUP, "--state-dir", str(state_dir), "run", "--key", "t", "--"]
    runs = [
        subprocess.Popen(
            [*base, "sh", "-c", COUNTER, "counter", str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in IDS
    ]
    try:
        with Client(state_dir) as client:
            old = client.status()["pid"]
            wait_until(lambda: len(_guards(client)) == 3, 20, 0.02, "three turns running")
            guards = _guards(client)
            ids = sorted(guards)
            wait_until(
                lambda: all(_log(state_dir, t).count(b"\n") >= 4 for t in ids), 20, 0.02, "output"
            )
            commands = {
                t: procs.identity_of(int(_log(state_dir, t).split(b"\n", 1)[0].split()[1]))
                for t in ids
            }
        done = ccsup("restart", state_dir=state_dir, timeout=60)
        assert done.returncode == 0, done.stderr
        with Client(state_dir) as client:
            status = client.status()
            supervisor.note(status["pid"])
            assert done.stdout.startswith(
                f"restarted: pid {old} -> {status['pid']}, adopted 3 of 3 turns in "
            ), done.stdout
            assert (status["adopted"], status["waiting_adoption"]) == (3, 0)
            assert _guards(client) == guards  # the same guards, now held by the new supervisor
        for turn_id in ids:
            assert procs.process_running(commands[turn_id]), turn_id
        assert all(run.poll() is None for run in runs)  # every `ccsup run` rode through
        go.touch()
        outputs = sorted(run.communicate(timeout=30)[0] for run in runs)
        assert [run.returncode for run in runs] == [0, 0, 0]
        # each run printed its command's whole output: every line once, in order, as logged
        assert outputs == sorted(_log(state_dir, t) for t in ids)
        for out in outputs:
            lines = out.decode().splitlines()
            assert lines[0].startswith("pid ") and lines[-1].startswith("done ")
            assert lines[1:-1] == [str(n) for n in range(len(lines) - 2)]
    finally:
        go.touch()
        for run in runs:
            if run.poll() is None:
                run.kill()
                run.wait()


@pytest.mark.timeout(60)
def test_sigusr2_hands_over_as_the_control_command_does(supervisor, tmp_path):
    state_dir = supervisor("2s", cap=1)
    go = tmp_path / "go"
    with Client(state_dir) as client:
        old = procs.identity_of(client.status()["pid"])
        assert old is not None
        client.turn("t", ["sh", "-c", COUNTER, "counter", str(go)], id="r0")
        wait_until(lambda: _log(state_dir, "r0").count(b"\n") >= 2, 20, 0.02, "the counter")
        (guard,) = _guards(client).values()
    try:
        os.kill(old.pid, signal.SIGUSR2)
        wait_until(lambda: not procs.process_running(old), 20, 0.01, "the old supervisor")
        assert procs.process_running(guard)
        (entry,) = store.read_queue(state_dir / "queue.json")["running"]
        assert entry["id"] == "r0" and entry["offsets"]["stdout"] > 0
    finally:
        go.touch()
        # nobody adopts it: the guard ends its turn itself after adopt_within
        wait_until(lambda: not procs.process_running(guard), 15, 0.05, "the guard to end")


MANY = 200


@pytest.mark.timeout(180)
def test_restart_with_200_running_turns_adopts_them_all_and_ends_none(supervisor, tmp_path):
    state_dir = supervisor("30s", cap=MANY)
    go = tmp_path / "go"
    # Each turn waits for the go file (checked every 0.2 s), then exits 0.
    wait_go = f'while [ ! -e "{go}" ]; do sleep 0.2; done'
    try:
        with Client(state_dir) as client:
            for n in range(MANY):
                client.turn("t", ["sh", "-c", wait_go], id=f"m{n:03d}")
            wait_until(lambda: len(_guards(client)) == MANY, 120, 0.1, f"{MANY} turns running")
            guards = _guards(client)
        done = ccsup("restart", "--timeout", "60", state_dir=state_dir, timeout=120)
        assert done.returncode == 0, done.stderr
        assert f"adopted {MANY} of {MANY} turns" in done.stdout, done.stdout
        with Client(state_dir) as client:
            status = client.status()
            supervisor.note(status["pid"])
            assert (status["adopted"], status["waiting_adoption"]) == (MANY, 0), status
            assert _guards(client) == guards  # every guard lived on, held by the new supervisor
            go.touch()
            wait_until(lambda: client.status()["turns"] == 0, 60, 0.1, "every turn's end")
        shown = ccsup("history", "--json", "--limit", str(2 * MANY), state_dir=state_dir)
        records = {r["id"]: r for r in json.loads(shown.stdout)}
        # each ended once, by itself, with its own status: none was ended by the hand-over
        assert [records[f"m{n:03d}"]["exit_code"] for n in range(MANY)] == [0] * MANY
    finally:
        go.touch()


# A program on a terminal: a counter on one line, each key, window size and SIGINT (^C) it gets
# on a line of its own; "q" ends it with status 7.
KEYS_AND_SIZES = r"""
import os, select, signal, sys, tty
tty.setcbreak(0)
said = []  # the handlers only note; the loop writes (a write in a handler could re-enter one)
signal.signal(signal.SIGWINCH, lambda *_: said.append("size"))
signal.signal(signal.SIGINT, lambda *_: said.append("sigint"))
i = interrupts = 0
while True:
    if select.select([0], [], [], 0.1)[0]:
        key = os.read(0, 1).decode()
        if key == "q":
            sys.exit(7)
        sys.stdout.write(f"\nkey {key}\n")
    while said:
        if said.pop(0) == "size":
            cols, rows = os.get_terminal_size(0)
            sys.stdout.write(f"\nsize {rows}x{cols}\n")
        else:
            interrupts += 1
            sys.stdout.write(f"\nsigint {interrupts}\n")
    i += 1
    sys.stdout.write(f"\rcount {i} ")
    sys.stdout.flush()
"""


def _count(screen: str) -> int:
    """The counter's value on the screen (its last line that shows one), -1 when none does."""
    shown = [line.split()[1] for line in screen.splitlines() if line.startswith("count ")]
    return int(shown[-1]) if shown and shown[-1].isdigit() else -1


@pytest.mark.timeout(120)
def test_a_terminal_turn_rides_through_a_sigkill_and_a_restart_with_its_keys_and_size(
    supervisor, tmp_path
):
    """`ccsup run -t` in tmux of a program that counts and reads keys: the supervisor is
    SIGKILLed and started again, then `ccsup restart`ed. After each, the screen goes on, a key and
    a resize reach the program, and the program's exit status is the client's (7)."""
    import sys
    import uuid

    from tmux_pane import Pane

    state_dir = supervisor("30s")
    env = {
        **os.environ,
        "CCSUP_STATE_DIR": str(state_dir),
        "CCSUP_CONFIG": str(state_dir / "ccsup.toml"),
    }
    program = tmp_path / "keys.py"
    program.write_text(KEYS_AND_SIZES)
    rc_file, said = tmp_path / "rc", tmp_path / "said"
    run = " ".join(CCSUP) + f" run --notices -t --key t -- {sys.executable} {program}"
    pane = Pane(
        f"ccsup-tt-{uuid.uuid4().hex[:8]}",
        f"{run} 2> {said}; echo $? > {rc_file}; sleep 600",
        env,
        width=120,
    )

    def screen_shows(text: str, what: str) -> None:
        wait_until(lambda: text in pane.screen(), 30, 0.05, f"{what}: {pane.screen()!r}")

    def still_works(step: int, key: str, rows: int, cols: int, what: str) -> None:
        """The counter goes on past what it showed, then a key, ^C and a new size reach it."""
        shown = _count(pane.screen())
        wait_until(
            lambda: _count(pane.screen()) > shown + 2, 30, 0.05, f"the counter to go on ({what})"
        )
        pane.keys(key)
        screen_shows(f"key {key}", f"the key {key} ({what})")
        pane.keys("C-c")
        screen_shows(f"sigint {step}", f"^C as SIGINT ({what})")
        pane.resize(cols, rows)
        screen_shows(f"size {rows}x{cols}", f"the size {rows}x{cols} ({what})")

    try:
        screen_shows("count ", "the terminal turn to start")
        still_works(1, "a", 20, 100, "before")
        with Client(state_dir) as client:
            (held,) = [s for s in client.ps()["slots"] if s["state"] == "held"]
            old_pid = client.status()["pid"]
        guard = held["pid"]
        os.kill(old_pid, signal.SIGKILL)
        wait_until(lambda: "is gone; waiting up to" in said.read_text(), 30, 0.05, "run to wait")
        started = ccsup("start", state_dir=state_dir)
        assert started.returncode == 0, started.stderr
        with Client(state_dir) as client:
            supervisor.note(client.status()["pid"])
            assert client.status()["adopted"] == 1
        wait_until(lambda: "a supervisor answers again" in said.read_text(), 30, 0.05, "back")
        still_works(2, "b", 22, 90, "after the SIGKILL and a start")
        restarted = ccsup("restart", state_dir=state_dir, stdin=subprocess.DEVNULL)
        assert restarted.returncode == 0, restarted.stderr
        assert "adopted 1 of 1 turns" in restarted.stdout
        with Client(state_dir) as client:
            supervisor.note(client.status()["pid"])
            (slot,) = [s for s in client.ps()["slots"] if s["state"] == "held"]
        assert (slot["turn"], slot["pid"]) == (held["turn"], guard)  # the same guard all along
        wait_until(lambda: said.read_text().count("a supervisor answers again") == 2, 30, 0.05)
        still_works(3, "c", 18, 110, "after the restart")
        pane.keys("q")
        wait_until(rc_file.exists, 30, 0.05, f"the client to exit: {pane.screen()!r}")
        assert rc_file.read_text().strip() == "7", said.read_text()
    finally:
        pane.close()
