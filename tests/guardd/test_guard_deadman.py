"""The guard's dead-man deadline (--deadline-file, guardd.deadman): a turn ends on its own when
the deadline its starter keeps pushing forward stops moving."""

from __future__ import annotations

import threading
import time

import pytest
from guard_run import GuardRun, gone, py

from guardd import deadman
from guardd.__main__ import parse_args

pytestmark = pytest.mark.timeout(30)


def test_the_option_is_parsed():
    opts = parse_args(["--deadline-file", "/x/deadman", "--", "true"])
    assert opts.deadline_file == "/x/deadman"
    assert parse_args(["true"], env={}).deadline_file is None
    env = {"CCSUP_GUARD_DEADLINE_FILE": "/y"}
    assert parse_args(["true"], env=env).deadline_file == "/y"
    assert parse_args(["--deadline-file", "/x", "true"], env=env).deadline_file == "/x"


class Pusher:
    """Keeps pushing the deadline file forward (stop_at = now + ahead) from a thread, as the
    supervisor's lease thread does, until stop()."""

    def __init__(self, path, ahead: float):
        self.path, self.ahead = path, ahead
        self._stop = threading.Event()
        self.push()
        self._thread = threading.Thread(target=self._run)
        self._thread.start()

    def push(self) -> None:
        now = deadman.boottime()
        deadman.write_deadline(self.path, now + self.ahead, now + 10)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.push()

    def stop(self) -> float:
        """Stop pushing; returns the last stop_at written."""
        self._stop.set()
        self._thread.join()
        return deadman.read_deadline(self.path)[0]


@pytest.fixture
def guard_run():
    """A factory of GuardRun; each one still running at the end is killed and reaped."""
    made: list[GuardRun] = []
    pushers: list[Pusher] = []

    def make(*args, **kwargs) -> GuardRun:
        g = GuardRun(*args, **kwargs)
        made.append(g)
        return g

    make.pushers = pushers
    yield make
    for p in pushers:
        p.stop()
    for g in made:
        g.close()


def test_a_deadline_pushed_forward_keeps_the_turn_and_one_left_alone_ends_it(tmp_path, guard_run):
    path = tmp_path / "deadman"
    # Pushed every 50 ms, 1 s ahead: a pusher thread late by most of a second on a loaded machine
    # still keeps the turn (0.3 s ahead was missed under two CPU hogs, as a starved lease thread
    # would be; that the guard then stops is right).
    pusher = Pusher(path, ahead=1.0)  # from before the guard starts, however slowly it starts
    guard_run.pushers.append(pusher)
    g = guard_run(tmp_path, py("setsid-child", "stay"), "--deadline-file", str(path), grace=0.3)
    child, _ = g.announced("child")  # in a session of its own, ignoring SIGTERM
    cmd, _ = g.announced("ready")
    time.sleep(3.2)  # the deadline is pushed for more than three of its windows meanwhile
    assert g.proc.poll() is None and not gone(cmd) and not gone(child)
    last_stop_at = pusher.stop()
    # Left alone: the guard stops the turn at stop_at, SIGKILLs the SIGTERM-ignoring child.
    assert g.wait() == 128 + 15
    assert deadman.boottime() - last_stop_at < 0.3 + 1.0  # the grace, and a loaded machine
    assert gone(cmd) and gone(child)
    rec = g.record()
    assert rec["reason"] == "deadline" and rec["state"] == "gone"


def test_past_kill_at_the_work_is_killed_without_a_grace(tmp_path, guard_run):
    path = tmp_path / "deadman"
    # Far ahead until CMD is up: this test is about a deadline written past, not a late pusher.
    pusher = Pusher(path, ahead=3)
    guard_run.pushers.append(pusher)
    g = guard_run(tmp_path, py("setsid-child", "stay"), "--deadline-file", str(path), grace=20)
    child, _ = g.announced("child")  # ignores SIGTERM: only SIGKILL ends it
    g.announced("ready")
    pusher.stop()
    now = deadman.boottime()
    deadman.write_deadline(path, now - 2, now - 1)  # as after a suspend or a frozen starter
    # The guard reads the file when its last stop_at comes (3 s ahead): past kill_at, no grace.
    assert g.wait(timeout=25) == 128 + 15
    assert deadman.boottime() - now < 3 + 2  # not the 20 s grace on top (a loaded machine: 2 s)
    assert gone(child)
    assert g.record()["reason"] == "deadline"


@pytest.mark.parametrize("content", [None, b"", b"{not json", b'{"v": 1}', b'{"v": 9}'])
def test_a_missing_or_bad_deadline_file_reads_as_past(tmp_path, guard_run, content):
    path = tmp_path / "deadman"
    if content is not None:
        path.write_bytes(content)
    g = guard_run(tmp_path, py("sleep"), "--deadline-file", str(path), grace=0.3)
    assert g.wait() == 128 + 15
    assert g.record()["reason"].startswith("deadline: ")
