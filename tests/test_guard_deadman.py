"""The guard's dead-man deadline (--deadline-file, guardd.deadman): a turn ends on its own when
the deadline its starter keeps pushing forward stops moving."""

from __future__ import annotations

import threading

import pytest
from test_guard import GuardRun, gone, py

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


def test_a_deadline_pushed_forward_keeps_the_turn_and_one_left_alone_ends_it(tmp_path):
    path = tmp_path / "deadman"
    deadman.write_deadline(path, deadman.boottime() + 0.3, deadman.boottime() + 10)
    g = GuardRun(tmp_path, py("setsid-child", "stay"), "--deadline-file", str(path), grace=0.3)
    child, _ = g.announced("child")  # in a session of its own, ignoring SIGTERM
    cmd, _ = g.announced("ready")
    # Pushed forward for a while (well past the first stop_at): the turn keeps running.
    stop = threading.Event()

    def push():
        while not stop.wait(0.05):
            deadman.write_deadline(path, deadman.boottime() + 0.3, deadman.boottime() + 10)

    pusher = threading.Thread(target=push)
    pusher.start()
    try:
        assert g.proc.poll() is None
        assert not stop.wait(1.0)
        assert g.proc.poll() is None and not gone(cmd) and not gone(child)
    finally:
        stop.set()
        pusher.join()
    left_at = deadman.boottime()
    # Left alone: the guard stops the turn at stop_at, SIGKILLs the SIGTERM-ignoring child.
    assert g.wait() == 128 + 15
    assert deadman.boottime() - left_at < 0.3 + 0.3 + 1.0
    assert gone(cmd) and gone(child)
    rec = g.record()
    assert rec["reason"] == "deadline" and rec["state"] == "gone"


def test_past_kill_at_the_work_is_killed_without_a_grace(tmp_path):
    path = tmp_path / "deadman"
    deadman.write_deadline(path, deadman.boottime() + 1.0, deadman.boottime() + 10)
    g = GuardRun(tmp_path, py("setsid-child", "stay"), "--deadline-file", str(path), grace=20)
    child, _ = g.announced("child")  # ignores SIGTERM: only SIGKILL ends it
    g.announced("ready")
    now = deadman.boottime()
    deadman.write_deadline(path, now - 2, now - 1)  # as after a suspend or a frozen starter
    assert g.wait() == 128 + 15
    assert deadman.boottime() - now < 1.0 + 1.5  # the first stop_at, not the 20 s grace
    assert gone(child)
    assert g.record()["reason"] == "deadline"


@pytest.mark.parametrize("content", [None, b"", b"{not json", b'{"v": 1}', b'{"v": 9}'])
def test_a_missing_or_bad_deadline_file_reads_as_past(tmp_path, content):
    path = tmp_path / "deadman"
    if content is not None:
        path.write_bytes(content)
    g = GuardRun(tmp_path, py("sleep"), "--deadline-file", str(path), grace=0.3)
    assert g.wait() == 128 + 15
    assert g.record()["reason"].startswith("deadline: ")
