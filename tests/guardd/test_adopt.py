"""A guard started with --adopt-within outlives its supervisor (guardd.channel): the work goes on,
contained, while it waits to be adopted over its channel; adopted, it watches its new supervisor;
never adopted, it ends the work (a setsid grandchild that ignores SIGTERM too) after adopt_within
plus the grace, reason "not_adopted"."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import wait_until

from guardd import procs

ADOPT_WITHIN = 1.5
GRACE = 0.3
# CMD: a setsid grandchild that ignores SIGTERM (its pid in a file), then CMD itself sleeps.
SCRIPT = (
    "setsid sh -c 'trap \"\" TERM; echo $$ > {pidfile}; exec sleep 300' & "
    "echo started; exec sleep 300"
)
# A stand-in supervisor: starts the guard (its child), prints the guard's pid, waits on stdin.
PARENT = (
    "import subprocess, sys\n"
    "p = subprocess.Popen([sys.executable, '-m', 'guardd', *sys.argv[1:]], start_new_session=True)\n"
    "print(p.pid, flush=True)\n"
    "sys.stdin.read()\n"
)
# A stand-in adopting supervisor: adopts the guard behind argv[1], prints the answer, waits.
ADOPTER = (
    "import json, sys\n"
    "from guardd import channel\n"
    "print(json.dumps(channel.adopt(sys.argv[1])), flush=True)\n"
    "sys.stdin.read()\n"
)


def start_parent(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    args = ["--record-dir", str(tmp_path / "guards"), "--log-dir", str(tmp_path)]
    args += ["--grace", str(GRACE), "--adopt-within", f"{ADOPT_WITHIN}s"]
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, *args, "--", "sh", "-c", SCRIPT.format(pidfile=pidfile)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    guard = procs.identity_of(int(parent.stdout.readline()))
    wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), what="the grandchild")
    grandchild = procs.identity_of(int(pidfile.read_text()))
    return parent, guard, grandchild


def record(tmp_path, guard) -> dict:
    path = tmp_path / "guards" / f"{guard.pid}-{guard.start}.json"
    return wait_until(lambda: _read(path), what="the guard's record")


def _read(path):
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


@pytest.mark.timeout(60)
def test_unadopted_work_runs_adopt_within_then_ends_with_its_setsid_grandchild(tmp_path, cleanup):
    parent, guard, grandchild = start_parent(tmp_path)
    cleanup += [parent, guard, grandchild]
    channel_path = record(tmp_path, guard)["channel"]["path"]
    assert os.stat(channel_path).st_mode & 0o777 == 0o600  # owner-only
    parent.kill()  # the supervisor dies outright
    parent.wait()
    gone_at = time.monotonic()
    waiting = wait_until(
        lambda: (r := record(tmp_path, guard))["waiting_since"] is not None and r,
        what="the guard waiting to be adopted",
    )
    assert waiting["state"] == "running"
    time.sleep(ADOPT_WITHIN / 2)  # still within adopt_within: nothing of the work has ended
    assert procs.process_running(grandchild) and procs.process_running(guard)
    wait_until(lambda: not procs.process_running(grandchild), timeout=10, what="the end")
    ended_after = time.monotonic() - gone_at
    assert ADOPT_WITHIN <= ended_after <= ADOPT_WITHIN + GRACE + 2.0
    final = wait_until(lambda: (r := record(tmp_path, guard))["state"] == "gone" and r, what="gone")
    assert final["reason"] == "not_adopted"
    assert not os.path.exists(channel_path)  # the channel goes with the guard


@pytest.mark.timeout(60)
def test_an_adopted_guard_keeps_the_work_and_watches_its_new_supervisor(tmp_path, cleanup):
    parent, guard, grandchild = start_parent(tmp_path)
    cleanup += [parent, guard, grandchild]
    channel_path = record(tmp_path, guard)["channel"]["path"]
    parent.kill()
    parent.wait()
    wait_until(lambda: record(tmp_path, guard)["waiting_since"] is not None, what="waiting")
    adopter = subprocess.Popen(
        [sys.executable, "-c", ADOPTER, channel_path],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    cleanup.append(adopter)
    answer = json.loads(adopter.stdout.readline())
    assert answer["ok"] is True and answer["guard"] == guard.to_json()
    assert 0 < answer["waited_s"] < ADOPT_WITHIN
    # committed at the adopter's ack, which follows the answer (guardd.channel)
    adopted = wait_until(lambda: (r := record(tmp_path, guard))["adopted_at"] is not None and r)
    assert adopted["waiting_since"] is None
    time.sleep(ADOPT_WITHIN + GRACE + 0.5)  # past the deadline it would have had: it is gone
    assert procs.process_running(grandchild) and record(tmp_path, guard)["state"] == "running"
    adopter.kill()  # the adopter dies too: the guard waits for it as it did for the first
    adopter.wait()
    wait_until(lambda: not procs.process_running(grandchild), timeout=10, what="the end")
    final = wait_until(lambda: (r := record(tmp_path, guard))["state"] == "gone" and r, what="gone")
    assert final["reason"] == "not_adopted"


@pytest.mark.timeout(30)
def test_a_bad_request_on_the_channel_is_refused_and_changes_nothing(tmp_path, cleanup):
    import socket

    parent, guard, grandchild = start_parent(tmp_path)
    cleanup += [parent, guard, grandchild]
    channel_path = record(tmp_path, guard)["channel"]["path"]
    for message in (b"not json", b'{"v": 2, "op": "adopt"}', b'{"v": 1, "op": "adopt"}'):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sock.settimeout(5)
        sock.connect(channel_path)
        sock.send(message)
        answer = sock.recv(4096)
        sock.close()
        if message == b"not json":
            assert answer == b""  # closed without a word
        else:
            assert json.loads(answer)["ok"] is False  # a newer version; no pidfd with the adopt
    assert record(tmp_path, guard)["adopted_at"] is None
    parent.kill()  # its first supervisor is still the one watched: the wait starts now
    parent.wait()
    wait_until(lambda: record(tmp_path, guard)["waiting_since"] is not None, what="waiting")
    procs.signal_process(guard, signal.SIGTERM)  # ended as any guard is
    wait_until(lambda: record(tmp_path, guard)["state"] == "gone", what="gone")


def _adopt_as_another_user(channel_path: str) -> dict:
    """channel.adopt from a forked child that became uid/gid 65534 first (the modules it needs
    are loaded before: that user may not read this interpreter's files). Its answer, or the
    refusal it met."""
    from guardd import channel

    head, name = os.path.split(channel_path)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(r)
            # The directory opened first: the test's own parents are 0700 (root's), and the
            # point is what the socket itself lets another user do once it can reach it.
            dir_fd = os.open(head, os.O_PATH | os.O_DIRECTORY)
            os.setgid(65534)
            os.setuid(65534)
            try:
                result = channel.adopt(f"/proc/self/fd/{dir_fd}/{name}", timeout=2)
            except OSError as e:
                result = {"refused": str(e)}
            os.write(w, json.dumps(result, default=str).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    return json.loads(data)


@pytest.mark.timeout(60)
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user (uid 65534)")
def test_another_user_cannot_adopt_a_waiting_guard_even_through_an_open_socket(tmp_path, cleanup):
    parent, guard, grandchild = start_parent(tmp_path)
    cleanup += [parent, guard, grandchild]
    channel_path = record(tmp_path, guard)["channel"]["path"]
    parent.kill()
    parent.wait()
    wait_until(lambda: record(tmp_path, guard)["waiting_since"] is not None, what="waiting")
    # Everything on the way opened to others: only SO_PEERCRED is left to refuse them.
    for path in (tmp_path, tmp_path / "guards"):
        os.chmod(path, 0o755)
    os.chmod(channel_path, 0o777)
    answer = _adopt_as_another_user(channel_path)
    assert "refused" in answer, answer  # closed unanswered: nothing changed
    after = record(tmp_path, guard)
    assert after["adopted_at"] is None and after["waiting_since"] is not None
    assert procs.process_running(grandchild)  # the work still waits for its own adopter
    # and nobody came: it ends as unadopted work does
    final = wait_until(lambda: (r := record(tmp_path, guard))["state"] == "gone" and r, 15)
    assert final["reason"] == "not_adopted"
