"""`ccsup status` counts the guards that wait for adoption, while any do.

Real guards: `ccsup-guard --adopt-within` started by a stand-in supervisor (a child of the test)
that is then SIGKILLed, so each guard keeps its turn's work running and says in its record that
it waits. With no supervisor, `ccsup status` still exits 3 and says how many turns wait and until
when the last does; with one, its status answer and text count them. Records that do not belong
to a live guard (its pid reused, a symlink, a deadline passed) are not counted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import PYTHON, wait_until

from guardd import procs
from guardd.record import encode

# A stand-in supervisor: starts the guard (its child, in a session of its own), prints its pid,
# waits on stdin until it is killed.
PARENT = (
    "import subprocess, sys\n"
    "p = subprocess.Popen([sys.executable, '-m', 'guardd', *sys.argv[1:]], start_new_session=True)\n"
    "print(p.pid, flush=True)\n"
    "sys.stdin.read()\n"
)


def record_of(guards, guard) -> dict | None:
    try:
        return json.loads((guards / f"{guard.pid}-{guard.start}.json").read_text())
    except (FileNotFoundError, ValueError):
        return None


def waiting_guard(state_dir, adopt_within: str, started: list):
    """A guard whose supervisor was SIGKILLed, waiting for adoption; (its identity, record)."""
    guards = state_dir / "guards"
    guards.mkdir(exist_ok=True)
    args = ["--record-dir", str(guards), "--log-dir", str(state_dir), "--grace", "0.3"]
    args += ["--adopt-within", adopt_within, "--", "sleep", "300"]
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    started.append(parent)
    guard = procs.identity_of(int(parent.stdout.readline()))
    assert guard is not None
    started.append(guard)
    wait_until(lambda: (record_of(guards, guard) or {}).get("state") == "running", what="running")
    parent.kill()  # the supervisor dies outright
    parent.wait()
    record = wait_until(
        lambda: (r := record_of(guards, guard)) and r.get("waiting_since") is not None and r,
        what="the guard waiting to be adopted",
    )
    return guard, record


def end_guard(state_dir, guard) -> None:
    """SIGTERM: the guard ends its work as any guard does, and says it is gone."""
    procs.signal_process(guard, signal.SIGTERM)
    wait_until(
        lambda: (record_of(state_dir / "guards", guard) or {}).get("state") in (None, "gone"),
        what="the guard gone",
    )
    wait_until(lambda: not procs.process_running(guard), what="the guard's exit")


@pytest.fixture
def started():
    things: list = []
    yield things
    for thing in things:  # by pid: the stand-in parents, and any guard still there
        if isinstance(thing, subprocess.Popen):
            thing.kill()
            thing.wait()
        elif procs.process_running(thing):
            procs.signal_process(thing, signal.SIGTERM)  # the guard ends its own work
            wait_until(lambda t=thing: not procs.process_running(t), what="the guard's end")


def ccsup(state_dir, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-m", "supervisor", "--state-dir", str(state_dir), *args],
        capture_output=True,
        text=True,
        timeout=30,
    )


def clock(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts))


def deadline(record: dict) -> float:
    return record["waiting_since"] + record["adopt_within"]


def plant(guards, name: str, guard: dict, waiting_since: float, adopt_within: float = 30.0):
    """A record as a waiting guard writes it, under a name of our choosing."""
    record = {"v": 1, "guard": guard, "turn": "planted", "state": "running", "groups": []}
    record |= {"waiting_since": waiting_since, "adopt_within": adopt_within, "adopted_at": None}
    record["channel"] = {"v": 1, "path": str(guards / "planted.sock")}
    (guards / name).write_bytes(encode(record))


@pytest.mark.timeout(90)
def test_with_no_supervisor_status_says_how_many_turns_wait_and_until_when(state_dir, started):
    first, first_record = waiting_guard(state_dir, "300s", started)
    second, second_record = waiting_guard(state_dir, "400s", started)
    guards = state_dir / "guards"
    me = procs.identity_of(os.getpid())
    # Not counted: a record naming a live pid with another start (the pid reused); one whose
    # deadline has passed; a symlink to a waiting record (never followed); no JSON; a FIFO.
    plant(
        guards, f"{me.pid}-{me.start + 1}.json", {"pid": me.pid, "start": me.start + 1}, time.time()
    )
    plant(guards, f"{me.pid}-{me.start}.json", me.to_json(), time.time() - 100)
    os.symlink(guards / f"{second.pid}-{second.start}.json", guards / "1-1.json")
    (guards / "2-2.json").write_text("{not json")
    os.mkfifo(guards / "3-3.json")  # opened without blocking, and refused: never hangs status
    last = max(deadline(first_record), deadline(second_record))

    both = ccsup(state_dir, "status")
    assert both.returncode == 3, both.stderr
    assert both.stdout == ""
    assert both.stderr == (
        f"ccsup: no supervisor is running on {state_dir}; 2 turns wait for adoption (the last "
        f"until {clock(last)}); start a supervisor to adopt them: ccsup start\n"
    )
    assert ccsup(state_dir, "status", "--json").returncode == 3
    assert procs.process_running(first) and procs.process_running(second)  # nothing changed

    end_guard(state_dir, second)
    one = ccsup(state_dir, "status")
    assert one.returncode == 3
    assert one.stderr.endswith(
        f"; 1 turn waits for adoption (until {clock(deadline(first_record))}); start a "
        "supervisor to adopt it: ccsup start\n"
    )
    end_guard(state_dir, first)
    none = ccsup(state_dir, "status")
    assert none.returncode == 3
    assert none.stderr == (
        f"ccsup: no supervisor is running on {state_dir}; start one with `ccsup start`\n"
    )


@pytest.mark.timeout(90)
def test_a_running_supervisors_status_counts_the_guards_it_has_not_adopted(
    daemon, state_dir, started
):
    d = daemon()
    assert ccsup(state_dir, "status").returncode == 0
    with d.client() as client:
        assert client.status()["waiting_adoption"] == 0
    assert "adopt" not in ccsup(state_dir, "status").stdout  # nothing adopted, nothing waits
    guard, record = waiting_guard(state_dir, "300s", started)
    shown = ccsup(state_dir, "status")
    assert shown.returncode == 0, shown.stderr
    line = f"adopt   1 turn waits for adoption (until {clock(deadline(record))})"
    assert line in shown.stdout.splitlines()
    answer = json.loads(ccsup(state_dir, "status", "--json").stdout)
    assert answer["waiting_adoption"] == 1
    assert answer["waiting_adoption_until"] == deadline(record)
    from supervisor.guards import waiting

    name = f"{guard.pid}-{guard.start}.json"  # a supervisor's own guards are skipped unread
    assert waiting.survey(state_dir / "guards", skip={name}).count == 0
    assert waiting.survey(state_dir / "guards").count == 1
    end_guard(state_dir, guard)
    with d.client() as client:
        assert client.status()["waiting_adoption"] == 0
    assert "adopt" not in ccsup(state_dir, "status").stdout  # nothing adopted, nothing waits
