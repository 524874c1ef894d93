"""Running turns outlive their supervisor: a supervisor SIGKILLed (a crash, the OOM
killer) and started again adopts the turns it was running (supervisor.turns.adopt). Real
supervisors, guards and commands; the faults are real SIGKILLs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from conftest import MARKER, wait_until

from guardd import procs

LINES = 100
# A counter every 50 ms (5 s in all), then exit 0: every line must reach the log once, in order.
COUNTER = f"i=0; while [ $i -lt {LINES} ]; do echo $i; i=$((i+1)); sleep 0.05; done"


def _log(state_dir: Path, turn: str, stream: str = "stdout") -> bytes:
    try:
        return (state_dir / "turns" / turn / f"{stream}.log").read_bytes()
    except FileNotFoundError:
        return b""


def _guards(state_dir: Path) -> dict[str, dict]:
    """turn id -> its guard record (the newest guard of each turn)."""
    found: dict[str, dict] = {}
    for path in (state_dir / "guards").glob("*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being replaced: the next look finds it
        found[data["turn"]] = data
    return found


class TurnSampler:
    """From outside: every 10 ms, how many of these turns have a live process (by the CCSUP_TURN
    marker in each process's environment); the most seen at once."""

    def __init__(self, turns: list[str]):
        self.markers = {f"CCSUP_TURN={t}".encode(): t for t in turns}
        # this test's processes only: a parallel test's turns may have the same ids
        self.ours = f"{MARKER}={os.environ[MARKER]}".encode()
        self.most = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _live(self) -> set[str]:
        live: set[str] = set()
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/environ", "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                continue
            if self.ours not in env:
                continue
            for var in env:
                turn = self.markers.get(var)
                if turn is not None:
                    stat = procs.read_stat(int(name))
                    if stat is not None and not stat.zombie:
                        live.add(turn)
        return live

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.most = max(self.most, len(self._live()))
            self.samples += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def _story(state_dir: Path, turn: str) -> dict:
    """`ccsup show ID --json`: what the history says of the turn."""
    from cli_daemon import ccsup

    shown = ccsup("show", "--json", turn, state_dir=state_dir)
    return json.loads(shown.stdout) if shown.returncode == 0 else {}


def _counted_lines(data: bytes) -> list[int]:
    return [int(line) for line in data.decode().splitlines()]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("zygote_too", [False, True], ids=["supervisor", "supervisor+zygote"])
def test_a_supervisor_killed_and_started_again_adopts_its_running_turns(
    daemon, state_dir, event_log, zygote_too
):
    d = daemon(caps="codex = 3", adopt_within="30s")
    running, queued = ["a1", "a2", "a3"], "q1"
    sampler = TurnSampler([*running, queued])
    try:
        with d.client() as client:
            for turn in running:
                client.turn("codex", ["sh", "-c", COUNTER], id=turn)
            client.turn("codex", ["sh", "-c", "echo queued"], id=queued)
            wait_until(lambda: all(_log(state_dir, t).count(b"\n") >= 3 for t in running), 20)
            zygote = (
                [p.pid for p in _children(d.proc.pid) if "zygote" in _cmdline(p.pid)]
                if zygote_too
                else []
            )
        cgroups = [r.get("cgroup") for t, r in _guards(state_dir).items() if t in running]
        d.proc.send_signal(signal.SIGKILL)
        for pid in zygote:
            os.kill(pid, signal.SIGKILL)
        d.proc.wait()
        before = {t: len(_log(state_dir, t)) for t in running}
        time.sleep(1.0)  # the gap: started again 1 s later
        # Meanwhile the work ran on and its output reached the logs.
        assert all(len(_log(state_dir, t)) > before[t] for t in running), before
        d.start()
        events = event_log(d)
        with d.client() as client:
            status = client.status()
            assert status["adopted"] == 3, status
            slots = {s["turn"]: s for s in client.ps()["slots"] if s.get("turn")}
        assert all(slots[t].get("adopted_at") for t in running), slots
        for turn in running:
            exited = events.wait_for(f"turn.{turn}.exited", timeout=30)
            assert exited["code"] == 0, exited
            events.wait_for(f"turn.{turn}.released", timeout=30)
            assert _counted_lines(_log(state_dir, turn)) == list(range(LINES))
            _published_tiles_the_log(events, state_dir, turn)
        events.wait_for(f"turn.{queued}.released", timeout=30)
        assert _log(state_dir, queued) == b"queued\n"
        if status["containment"] == "cgroup":
            # the adopted turns' cgroups, under the dead supervisor's ccsup.<pid>.<start>, are
            # removed after their release, and that parent once it is empty
            assert all(cgroups) and len({os.path.dirname(c) for c in cgroups}) == 1, cgroups
            assert not any(os.path.exists(c) for c in cgroups)
            assert not os.path.exists(os.path.dirname(cgroups[0]))
    finally:
        sampler.stop()
    assert sampler.samples > 50
    assert sampler.most <= 3, f"{sampler.most} turns of a cap-3 key ran at once"


def _published_tiles_the_log(events, state_dir: Path, turn: str) -> None:
    """The new supervisor's stdout events, from the first one on, are the log's bytes at their
    offsets, with no hole (bytes published before the gap may come again, the same)."""
    from supervisor.wire import protocol

    log = _log(state_dir, turn)
    chunks = [protocol.output_bytes(b) for b in events.find(f"turn.{turn}.stdout")]
    assert chunks, "no output was published after the adoption"
    position = chunks[0][0]
    for offset, data in chunks:
        assert log[offset : offset + len(data)] == data
        assert offset <= position, f"a hole at {position}..{offset}"
        position = max(position, offset + len(data))
    assert position == len(log)


def _children(pid: int) -> list[procs.Stat]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = procs.read_stat(int(name))
            if stat is not None and stat.ppid == pid:
                out.append(stat)
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


# A grandchild in a session of its own that ignores SIGTERM: only SIGKILL (or the cgroup) ends it.
STUBBORN = (
    "setsid sh -c 'trap \"\" TERM; echo $$ > stubborn.pid; while :; do sleep 0.05; done' & "
    "while :; do sleep 0.05; done"
)


@pytest.mark.timeout(60)
def test_unadopted_work_ends_after_adopt_within_and_the_next_supervisor_frees_the_slot(
    daemon, state_dir, tmp_path, event_log
):
    d = daemon(caps="codex = 1", adopt_within="1s", grace="300ms")
    with d.client() as client:
        client.turn("codex", ["sh", "-c", STUBBORN], id="u1", cwd=str(tmp_path))
    pid_file = tmp_path / "stubborn.pid"
    wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), 20, what="stubborn")
    stubborn = int(pid_file.read_text())
    ident = procs.identity_of(stubborn)
    assert ident is not None
    d.kill()
    killed_at = time.monotonic()
    record = wait_until(
        lambda: (r := _guards(state_dir).get("u1")) and r["state"] == "gone" and r,
        15,
        what="the guard's record saying gone",
    )
    assert record["reason"] == "not_adopted"
    assert not procs.process_running(ident)
    # adopt_within (1 s) + grace (0.3 s), and a loaded machine's lateness
    assert time.monotonic() - killed_at < 10
    d.start()
    events = event_log(d)
    with d.client() as client:
        assert client.status()["adopted"] == 0
        client.turn("codex", ["sh", "-c", "echo next"], id="n1")
    events.wait_for("turn.n1.released", 20)
    assert _log(state_dir, "n1") == b"next\n"


@pytest.mark.timeout(60)
def test_a_requester_killed_during_the_gap_gets_its_turn_stopped(daemon, state_dir, event_log):
    d = daemon(caps="codex = 1", adopt_within="30s")
    requester = subprocess.Popen(["sleep", "300"])
    try:
        ident = procs.identity_of(requester.pid)
        assert ident is not None
        holder = {"pid": ident.pid, "start": ident.start}
        with d.client() as client:
            client.turn("codex", ["sh", "-c", COUNTER], id="r1", holder=holder)
        wait_until(lambda: _log(state_dir, "r1").count(b"\n") >= 2, 20)
        d.kill()
        requester.kill()
        requester.wait()
        d.start()  # stopped at once: its events may be out before anyone subscribes
        story = wait_until(lambda: (s := _story(state_dir, "r1")).get("state") == "released" and s)
        assert story["reason"] == "requester_gone", story
        assert len(_counted_lines(_log(state_dir, "r1"))) < LINES
    finally:
        if requester.poll() is None:
            requester.kill()
            requester.wait()


@pytest.mark.timeout(60)
def test_a_turn_whose_timeout_ran_out_during_the_gap_is_stopped_with_reason_timeout(
    daemon, state_dir, event_log
):
    d = daemon(caps="codex = 1", adopt_within="30s")
    with d.client() as client:
        client.call("turn", key="codex", argv=["sh", "-c", COUNTER], id="t1", timeout=1.5)
    wait_until(lambda: _log(state_dir, "t1").count(b"\n") >= 2, 20)
    d.kill()
    wait_until(lambda: _log(state_dir, "t1").count(b"\n") >= 40, 20)  # 2 s of the turn's run
    d.start()
    story = wait_until(lambda: (s := _story(state_dir, "t1")).get("state") == "released" and s)
    assert story["reason"] == "timeout", story


@pytest.mark.timeout(60)
@pytest.mark.parametrize("slot_names", ["the guard", "the cgroup alone"])
def test_a_guard_that_cannot_be_spoken_to_is_not_adopted_nor_killed_blindly(
    daemon, state_dir, event_log, slot_names
):
    """`the cgroup alone`: the supervisor was killed before it named the guard in the slot
    (tests/helpers/killed_in_record_work.py); the guard is found by its own record, and its work
    is not ended blindly either (its cgroup was killed: CMD died with 137)."""
    from conftest import HELPERS

    d = daemon(caps="codex = 1", adopt_within="3s", grace="300ms", start=False)
    if slot_names == "the cgroup alone":
        (state_dir / "killed").write_text("n1\n")  # v1 alone is killed for
        d.program = [str(HELPERS / "killed_in_record_work.py"), str(state_dir / "killed")]
    d.start()
    started = event_log(d)
    with d.client() as client:
        client.turn("codex", ["sh", "-c", "echo up; sleep 60"], id="v1")
    if slot_names == "the guard":
        started.wait_for("turn.v1.started")  # named in the slot first
        d.kill()
    else:
        assert d.proc.wait(60) == -signal.SIGKILL  # in record_work, CMD running
    started.close()
    wait_until(lambda: _log(state_dir, "v1") == b"up\n", 20)
    record = wait_until(
        lambda: (r := _guards(state_dir).get("v1") or {}).get("waiting_since") and r,
        10,
        what="waiting",
    )
    guard = procs.Identity(record["guard"]["pid"], record["guard"]["start"])
    os.kill(guard.pid, signal.SIGSTOP)  # its channel answers nothing now
    try:
        d.start()
        with d.client() as client:
            status = client.status()
            assert status["adopted"] == 0 and status["waiting_adoption"] == 1, status
            assert client.call("reap")["reaped"] == []
            client.turn("codex", ["sh", "-c", "echo next"], id="n1")
            # still counted: orphaned, or held again for the lost turn once the restarted
            # supervisor has taken its slot back (which comes first depends on the machine's load)
            slot = client.ps()["slots"][0]
            assert slot["state"] == "orphaned" or (slot["state"], slot["turn"]) == ("held", "v1")
            assert [w["id"] for w in client.ps()["waits"]] == ["n1"]
        assert procs.process_running(guard)  # left to finish, not killed blindly
    finally:
        os.kill(guard.pid, signal.SIGCONT)
    events = event_log(d)
    # its own dead-man ends it (adopt_within is over); then its slot frees and the next runs
    events.wait_for("turn.n1.released", 30)
    assert not procs.process_running(guard)
    assert _guards(state_dir)["v1"]["reason"] == "not_adopted"


ECHO = "import sys\nprint('ready', flush=True)\nfor line in sys.stdin:\n    print('got', line.strip(), flush=True)\nprint('eof', flush=True)\n"


@pytest.mark.timeout(60)
def test_a_turns_stdin_stays_open_across_the_gap_and_send_works_after_adoption(
    daemon, state_dir, event_log
):
    import sys

    d = daemon(caps="codex = 1", adopt_within="30s")
    with d.client() as client:
        client.turn("codex", [sys.executable, "-c", ECHO], id="s1")
        wait_until(lambda: _log(state_dir, "s1") == b"ready\n", 20)
        client.send("s1", "one\n")
        wait_until(lambda: _log(state_dir, "s1").endswith(b"got one\n"), 20)
    d.kill()  # its stdin's writer dies with it (reaped: gone): CMD must not read EOF
    d.start()
    events = event_log(d)
    with d.client() as client:
        assert client.status()["adopted"] == 1
        client.send("s1", "two\n")
        wait_until(lambda: _log(state_dir, "s1").endswith(b"got two\n"), 20)
        client.send("s1", "", eof=True)
    assert events.wait_for("turn.s1.exited", 20)["code"] == 0
    assert _log(state_dir, "s1") == b"ready\ngot one\ngot two\neof\n"


@pytest.mark.timeout(60)
def test_a_guard_of_a_newer_version_is_counted_left_to_finish_and_reaped_once_its_work_is_gone(
    daemon, state_dir, event_log
):
    from guardd.record import write_json

    d = daemon(caps="codex = 1", adopt_within="3s", grace="300ms")
    started = event_log(d)
    with d.client() as client:
        client.turn("codex", ["sh", "-c", "echo up; sleep 60"], id="v2")
    wait_until(lambda: _log(state_dir, "v2") == b"up\n", 20)
    # the supervisor has named the guard in the slot (before `started`): a slot naming the
    # turn's cgroup alone is another case (test_a_supervisor_killed_before_it_named_...)
    started.wait_for("turn.v2.started")
    started.close()
    record = _guards(state_dir)["v2"]
    guard = procs.Identity(record["guard"]["pid"], record["guard"]["start"])
    path = state_dir / "guards" / f"{guard.pid}-{guard.start}.json"
    d.kill()
    wait_until(lambda: _guards(state_dir)["v2"].get("waiting_since"), 10, what="waiting")
    # As a later release's guard would leave it: a record of a version this one does not know
    # (the guard stopped, so that it does not write its own again meanwhile).
    os.kill(guard.pid, signal.SIGSTOP)
    try:
        write_json(path, {**json.loads(path.read_text()), "v": 2})
        d.start()
        with d.client() as client:
            assert client.status()["adopted"] == 0  # not adopted blindly
            client.turn("codex", ["sh", "-c", "echo next"], id="n1")
            assert client.call("reap")["reaped"] == []
            assert procs.process_running(guard)  # nor killed blindly
            slot = client.ps()["slots"][0]
            # still counted: unreadable (its record is of a newer version), or held again for the
            # lost turn once the restarted supervisor has taken its slot back (load decides which)
            if slot["state"] == "unreadable":
                assert "is version 2" in slot["error"], slot
            else:
                assert (slot["state"], slot["turn"]) == ("held", "v2"), slot
            assert [w["id"] for w in client.ps()["waits"]] == ["n1"]
        assert _log(state_dir, "n1") == b""  # still counted: the next waits
    finally:
        os.kill(guard.pid, signal.SIGCONT)
    events = event_log(d)
    # its own dead-man ends its work (adopt_within is over); then its slot frees and the next runs
    events.wait_for("turn.n1.released", 30)
    assert not procs.process_running(guard)
    assert _guards(state_dir)["v2"]["reason"] == "not_adopted"


@pytest.mark.timeout(60)
def test_a_command_that_ended_while_no_supervisor_ran_ends_with_its_own_status(daemon, state_dir):
    d = daemon(caps="codex = 1", adopt_within="30s")
    with d.client() as client:
        client.turn("codex", ["sh", "-c", "echo up; sleep 1; exit 7"], id="e1")
    wait_until(lambda: _log(state_dir, "e1") == b"up\n", 20)
    d.kill()
    ended = wait_until(lambda: (r := _guards(state_dir)["e1"])["state"] == "gone" and r, 15)
    assert ended["exit"]["code"] == 7
    time.sleep(3.0)  # the scenario: a supervisor started again seconds after the command ended
    d.start()  # nothing to adopt: its end is read from its guard's record
    story = wait_until(lambda: (s := _story(state_dir, "e1")).get("state") == "released" and s)
    assert story["exit_code"] == 7 and story["reason"] != "supervisor_restarted", story
    # dated by its guard (when its command ended), not by the restarted supervisor's settling
    assert story["exited_at"] == ended["exited_at"], (story, ended)
    assert 1.0 <= story["usage"]["wall_s"] < 3.0, story


@pytest.mark.timeout(60)
def test_a_command_that_ended_by_itself_after_the_restart_unadopted_ends_with_its_own_status(
    daemon, state_dir, event_log
):
    # Found by the adoption soak: its guard did not answer the adopter in time (a busy machine;
    # here it is stopped), so the turn was lost while its command ran on; once its guard left by
    # itself its story never ended (nothing was reaped) until the next start, and then read
    # supervisor_restarted (its guard's record was looked at only at the start).
    d = daemon(caps="codex = 1", adopt_within="30s")
    go = state_dir / "go"
    with d.client() as client:
        cmd = f'echo up; while [ ! -e "{go}" ]; do sleep 0.02; done; exit 7'
        client.turn("codex", ["sh", "-c", cmd], id="u7")
    wait_until(lambda: _log(state_dir, "u7") == b"up\n", 20)
    record = _guards(state_dir)["u7"]
    guard = procs.Identity(record["guard"]["pid"], record["guard"]["start"])
    d.kill()
    wait_until(lambda: _guards(state_dir)["u7"].get("waiting_since"), 10, what="waiting")
    os.kill(guard.pid, signal.SIGSTOP)  # it answers nothing: not adopted
    try:
        d.start()
        with d.client() as client:
            assert client.status()["adopted"] == 0
    finally:
        os.kill(guard.pid, signal.SIGCONT)
    events = event_log(d)
    go.touch()  # its command ends by itself; its guard records that and leaves
    with d.client() as client:
        client.turn("codex", ["sh", "-c", "echo next"], id="n1")  # granted once the slot frees
    events.wait_for("turn.n1.released", 30)
    # its story ends once its slot frees (it used to wait for the next supervisor's start)
    story = wait_until(lambda: (s := _story(state_dir, "u7")).get("state") == "released" and s)
    assert (story["exit_code"], story["reason"]) == (7, None), story


@pytest.mark.timeout(120)
def test_a_supervisor_killed_before_it_named_the_guard_in_the_slot_adopts_the_turn(
    daemon, state_dir
):
    """The guard runs CMD from its start; its supervisor writes it into the slot a moment later
    (the slot names only the turn's cgroup until then). Killed in between
    (tests/helpers/killed_in_record_work.py), the next supervisor finds the guard by its own
    record and adopts the turn: it runs to its own end, its output whole (a slot naming no guard
    was taken for work to end, and its cgroup was killed: exit 137)."""
    from conftest import HELPERS

    d = daemon(caps="codex = 1", adopt_within="30s", start=False)
    d.program = [str(HELPERS / "killed_in_record_work.py"), str(state_dir / "killed")]
    d.start()
    go = state_dir / "go"
    with d.client() as client:
        cmd = f"echo up; while [ ! -e {go} ]; do sleep 0.02; done; echo down; exit 7"
        client.turn("codex", ["sh", "-c", cmd], id="w1")
    assert d.proc.wait(60) == -signal.SIGKILL  # in record_work, CMD running
    d.start()
    with d.client() as client:
        assert client.status()["adopted"] == 1
        slot = client.ps()["slots"][0]
        assert (slot["state"], slot["turn"]) == ("held", "w1"), slot
    go.write_text("")
    story = wait_until(lambda: (s := _story(state_dir, "w1")).get("state") == "released" and s, 60)
    assert (story["exit_code"], story["reason"]) == (7, None), story
    assert _log(state_dir, "w1") == b"up\ndown\n"


@pytest.mark.timeout(300)
def test_a_supervisor_killed_right_after_each_started_loses_no_turn_under_load(daemon, state_dir):
    """`started` is published only once the guard runs CMD and its record names its channel
    (GuardProcess.when_ready): a supervisor SIGKILLed the moment it has published it (by itself:
    tests/helpers/killed_at.py started), 20 times under two CPU hogs, leaves every turn to be
    adopted and to run to its own end with its own status (none ends `parent_gone`, its command
    never run)."""
    import sys

    from conftest import HELPERS

    # Two CPU hogs, less what already runs beside this test (the suite's other workers, or the
    # hogs of a run under load): the load is what matters here, not whose it is.
    busy = min(2, int(os.getloadavg()[0]))
    hogs = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(2 - busy)]
    try:
        d = daemon(caps="codex = 2", adopt_within="30s", start=False)
        d.program = [str(HELPERS / "killed_at.py"), "started", str(state_dir / "killed")]
        d.start()
        marks = state_dir / "marks"
        for i in range(20):
            turn = f"k{i}"
            cmd = f'echo "ran {turn}" >> {marks}; sleep 0.3; exit {i % 5 + 1}'
            with d.client() as client:
                client.turn("codex", ["sh", "-c", cmd], id=turn)
            assert d.proc.wait(60) == -signal.SIGKILL  # the moment `started` was published
            d.start()
        ends = {}
        for i in range(20):
            turn = f"k{i}"
            story = wait_until(
                lambda t=turn: (s := _story(state_dir, t)).get("state") == "released" and s, 60
            )
            ends[turn] = (story["exit_code"], story["reason"])
        assert ends == {f"k{i}": (i % 5 + 1, None) for i in range(20)}, ends
        ran = marks.read_text().split("\n")[:-1]
        assert sorted(ran) == sorted(f"ran k{i}" for i in range(20)), ran  # each once
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
