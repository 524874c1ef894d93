"""Process identity and group liveness (guardd.procs), the guard record helpers and the scan,
on real processes. Pid reuse is simulated by a record naming a live pid with a wrong start."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from conftest import PYTHON, wait_until

from guardd import procs, record, scan


@pytest.fixture
def sleeper():
    """A `sleep` leading a process group of its own."""
    p = subprocess.Popen(["sleep", "300"], process_group=0)
    yield p
    p.kill()
    p.wait()


def test_live_group_is_alive_only_with_the_right_leader_start(sleeper):
    start = procs.start_ticks(sleeper.pid)
    assert procs.group_alive(procs.Group(sleeper.pid, start))
    # pid reuse: a record naming this id with another start is about another, gone, group
    assert not procs.group_alive(procs.Group(sleeper.pid, start + 1))
    assert not procs.group_alive(procs.Group(sleeper.pid, start - 1))
    # no leader recorded, yet a process has pid == pgid: the recorded group had emptied
    assert not procs.group_alive(procs.Group(sleeper.pid, None))


def test_groups_alive_of_a_record_follows_identity(sleeper):
    start = procs.start_ticks(sleeper.pid)
    rec = {"v": 1, "own_group": {"pgid": sleeper.pid, "leader_start": start}, "groups": []}
    assert record.groups_alive(rec)
    rec_reused = {
        "v": 1,
        "own_group": {"pgid": sleeper.pid, "leader_start": start + 7},
        "groups": [{"pgid": sleeper.pid, "leader_start": None, "seen_at": 1.0}],
    }
    assert not record.groups_alive(rec_reused)
    assert not record.groups_alive({"v": 1, "own_group": None, "groups": []})


def test_signal_process_checks_identity(sleeper):
    ident = procs.identity_of(sleeper.pid)
    assert not procs.signal_process(procs.Identity(ident.pid, ident.start + 1), signal.SIGKILL)
    assert procs.process_running(ident)  # the wrong identity was not signalled
    assert procs.signal_process(ident, signal.SIGKILL)
    assert sleeper.wait(5) == -signal.SIGKILL


LEADER_EXITS = (
    "import os, time\n"
    "os.setpgid(0, 0)\n"
    "if os.fork() == 0:\n"
    "    os.write(1, f'member {os.getpid()}\\n'.encode())\n"
    "    time.sleep(300)\n"
    "    os._exit(0)\n"
    "os.read(0, 1)\n"  # exit once the test has read the member's line
)


def test_group_whose_leader_is_gone_is_alive_while_a_member_runs():
    leader = subprocess.Popen(
        [PYTHON, "-c", LEADER_EXITS], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    leader_start = procs.start_ticks(leader.pid)
    member = procs.identity_of(int(leader.stdout.readline().split()[1]))
    leader.stdin.close()
    assert leader.wait(10) == 0
    leader.stdout.close()
    pgid = leader.pid
    assert procs.read_stat(pgid) is None  # the leader is reaped; its id stays pinned by the group
    assert procs.group_alive(procs.Group(pgid, None))
    assert procs.group_alive(procs.Group(pgid, leader_start))
    assert procs.signal_process(member, signal.SIGKILL)
    # the member is an orphan now; whoever reaps it, zombie or reaped, the group is gone
    wait_until(lambda: not procs.group_alive(procs.Group(pgid, None)), what="group gone")


def test_zombie_counts_as_gone_although_killpg_succeeds():
    p = subprocess.Popen(["true"], process_group=0)
    start = procs.start_ticks(p.pid)
    wait_until(lambda: procs.read_stat(p.pid).zombie, what="the child a zombie")
    os.killpg(p.pid, 0)  # does not raise: the zombie still holds the group id
    assert not procs.group_alive(procs.Group(p.pid, start))
    assert procs.process_exists(procs.Identity(p.pid, start))
    assert not procs.process_running(procs.Identity(p.pid, start))
    assert p.wait(5) == 0


def test_record_path_names_pid_and_start(tmp_path):
    ident = procs.Identity(123, 456)
    assert record.record_path(tmp_path, ident) == Path(tmp_path) / "123-456.json"


def test_a_rewritten_record_swaps_two_files_and_the_last_version_leaves_one(tmp_path):
    """Rewriter: from the second version on, no file is created or freed (the two inodes take
    turns); a reader holding the record open still reads its whole version; the last leaves no
    spare."""
    path = tmp_path / "1-2.json"
    spare = tmp_path / ".1-2.json.spare"
    writer = record.Rewriter(path)
    writer.write({"v": 1, "n": 1})
    assert os.listdir(tmp_path) == ["1-2.json"]
    first = path.stat().st_ino
    with open(path, "rb") as held:
        writer.write({"v": 1, "n": 2})
        assert held.read() == b'{"n":1,"v":1}'
    assert record.read_json(path)["n"] == 2 and record.read_json(spare)["n"] == 1
    assert spare.stat().st_ino == first
    inodes = {first, path.stat().st_ino}
    for n in range(3, 7):
        writer.write({"v": 1, "n": n})
        assert record.read_json(path)["n"] == n
        assert {path.stat().st_ino, spare.stat().st_ino} == inodes
    current = path.stat().st_ino
    writer.write({"v": 1, "n": 7}, last=True)
    assert os.listdir(tmp_path) == ["1-2.json"] and record.read_json(path)["n"] == 7
    assert path.stat().st_ino == current  # written in place: no file created for the last
    assert record.spare_file(path) == str(spare)


def test_a_record_written_twice_creates_one_file(tmp_path):
    """A turn that ends cleanly writes its guard record twice (running, then gone): the first is
    created, the last goes over it in place, so one file is made, not two."""
    path = tmp_path / "1-2.json"
    writer = record.Rewriter(path)
    writer.write({"v": 1, "state": "running", "groups": ["g"] * 20})
    first = path.stat().st_ino
    writer.write({"v": 1, "state": "gone"}, last=True)
    assert path.stat().st_ino == first and os.listdir(tmp_path) == ["1-2.json"]
    assert record.read_json(path) == {"v": 1, "state": "gone"}


def test_a_shorter_version_is_padded_over_the_spare_and_reads_exactly(tmp_path):
    path = tmp_path / "1-2.json"
    writer = record.Rewriter(path)
    writer.write({"v": 1, "groups": ["g"] * 50})
    writer.write({"v": 1, "groups": ["g"] * 50, "state": "stopping"})
    long = path.stat().st_size
    writer.write({"v": 1, "state": "gone"})  # over the first version's file, spaces after it
    assert record.read_json(path) == {"v": 1, "state": "gone"}
    assert path.stat().st_size > len(b'{"state":"gone","v":1}')  # no block freed by shortening
    before = path.stat().st_size
    writer.write({"v": 1, "state": "gone", "n": 4}, last=True)  # in place, padded too
    assert record.read_json(path) == {"v": 1, "state": "gone", "n": 4}
    assert os.listdir(tmp_path) == ["1-2.json"] and path.stat().st_size == before < long


def test_a_rewritten_record_is_renamed_into_place_where_files_cannot_be_swapped(
    tmp_path, monkeypatch
):
    from guardd import linux

    monkeypatch.setattr(linux, "exchange", lambda a, b: False)
    path = tmp_path / "1-2.json"
    writer = record.Rewriter(path)
    for n in range(1, 4):
        with open(path if n > 1 else os.devnull, "rb") as held:
            writer.write({"v": 1, "n": n})
            assert held.read() in (b"", b'{"n":%d,"v":1}' % (n - 1))
        assert os.listdir(tmp_path) == ["1-2.json"] and record.read_json(path)["n"] == n


def test_scan_reads_the_children_of_every_thread():
    # A child is listed under the thread that forked it (while that thread lives), not under the
    # main thread; a guard's orphans can land on any of its threads the same way.
    box, spawned, done = {}, threading.Event(), threading.Event()

    def spawn():
        box["p"] = subprocess.Popen(["sleep", "300"])
        spawned.set()
        done.wait(30)

    t = threading.Thread(target=spawn)
    t.start()
    spawned.wait(10)
    p = box["p"]
    try:
        me = os.getpid()
        main_children = Path(f"/proc/{me}/task/{me}/children").read_text().split()
        assert str(p.pid) not in main_children  # the test means something
        found = scan.descendants(me)
        assert p.pid in found
        assert found[p.pid].ppid == me
        assert found[p.pid].start == procs.start_ticks(p.pid)
    finally:
        p.kill()
        p.wait()
        done.set()
        t.join()
    assert p.pid not in scan.descendants(os.getpid())


def test_scan_finds_grandchildren_and_their_groups():
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    os.write(1, f'{os.getpid()}\\n'.encode())\n"
        "    time.sleep(300)\n"
        "os.read(0, 1)\n"
    )
    p = subprocess.Popen([PYTHON, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        grandchild = int(p.stdout.readline())
        found = scan.descendants(os.getpid())
        assert found[grandchild].ppid == p.pid
        assert found[grandchild].pgid == grandchild
    finally:
        os.kill(grandchild, signal.SIGKILL)
        p.stdin.close()
        p.wait(10)
        p.stdout.close()


def _proc_tuple(p: procs.Stat) -> tuple:
    return (p.pid, p.ppid, p.pgid, p.start, p.zombie)


def test_scanner_sees_what_a_fresh_scan_sees_as_the_tree_changes():
    code = (
        "import os, sys, time\n"
        "kids = []\n"
        "for line in sys.stdin:\n"
        "    if line.strip() == 'move':\n"  # a process already seen (its file held) changes group
        "        os.setpgid(kids[0], kids[0])\n"
        "        os.write(1, b'ok\\n')\n"
        "        continue\n"
        "    kids.append(os.fork())\n"
        "    if kids[-1] == 0:\n"
        "        if line.strip() == 'setsid':\n"
        "            os.setsid()\n"  # a held stat file must show the new pgid
        "        os.write(1, b'ok\\n')\n"  # the child says so once it is where it will stay
        "        time.sleep(300)\n"
        "        os._exit(0)\n"
    )
    p = subprocess.Popen(
        [PYTHON, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, process_group=0
    )
    sc = scan.Scanner(p.pid)
    try:
        for line in (b"plain\n", b"setsid\n", b"plain\n", b"move\n"):
            p.stdin.write(line)
            p.stdin.flush()
            assert p.stdout.readline() == b"ok\n"
            got, fresh = sc.descendants(), scan.descendants(p.pid)
            assert {k: _proc_tuple(v) for k, v in got.items()} == {
                k: _proc_tuple(v) for k, v in fresh.items()
            }
        assert len(got) == 3 and sc.held() == 3
        assert sorted(v.pgid == v.pid for v in got.values()) == [False, True, True]
        victim = min(got)
        os.kill(victim, signal.SIGKILL)
        wait_until(
            lambda: (
                got[victim].pid not in scan.descendants(p.pid)
                or scan.descendants(p.pid)[victim].zombie
            ),
            what="the victim dead",
        )
        got = sc.descendants()
        assert victim not in got or got[victim].zombie
        assert {k: _proc_tuple(v) for k, v in got.items()} == {
            k: _proc_tuple(v) for k, v in scan.descendants(p.pid).items()
        }
    finally:
        sc.close()
        for pid in scan.descendants(p.pid):  # the setsid one is outside the group
            os.kill(pid, signal.SIGKILL)
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(10)
        p.stdin.close()
        p.stdout.close()
    assert sc.held() == 0


def _fork_with_pid(pid: int) -> subprocess.Popen | None:
    """A `sleep` given exactly this pid, by setting ns_last_pid (root only); None if it missed."""
    with open("/proc/sys/kernel/ns_last_pid", "w") as f:
        f.write(str(pid - 1))
    p = subprocess.Popen(["sleep", "300"])
    if p.pid == pid:
        return p
    p.kill()
    p.wait()
    return None


def test_scanner_never_reports_a_reused_pid_as_the_old_process():
    if not os.access("/proc/sys/kernel/ns_last_pid", os.W_OK):
        pytest.skip("cannot set ns_last_pid here: pid reuse cannot be forced")
    sc = scan.Scanner(os.getpid())
    try:
        old = subprocess.Popen(["sleep", "300"])
        first = sc.descendants()[old.pid]
        # The reuse must start in a later clock tick, or start ticks could not tell them apart.
        tick = 1 / os.sysconf("SC_CLK_TCK")
        time.sleep(2 * tick)
        assert sc.held() >= 1
        old.kill()
        old.wait()  # reaped: the number is free; the scanner still holds the old /proc files
        for _ in range(20):  # other processes on the machine may take the number first
            new = _fork_with_pid(old.pid)
            if new is not None:
                break
        else:
            pytest.skip("pid reuse could not be forced (a busy machine took the number)")
        try:
            new_start = procs.start_ticks(new.pid)
            if new_start == first.start:  # same tick: the check below could not tell them apart
                pytest.skip("the reused pid started in the same clock tick")
            seen = sc.descendants()[new.pid]
            assert (seen.pid, seen.start, seen.zombie) == (old.pid, new_start, False)
        finally:
            new.kill()
            new.wait()
    finally:
        sc.close()


def test_a_subreaper_with_a_thousand_children_has_them_all_scanned():
    # /proc/<pid>/task/<tid>/children gives at most about a page a read (~800 pids): a guard with
    # more orphans than that saw only the first page of them (seen failing: 682 of 1,000).
    parent = subprocess.Popen(
        [
            PYTHON,
            "-c",
            "import subprocess, sys\n"
            "ps = [subprocess.Popen(['sleep', '120']) for _ in range(1000)]\n"
            "print('ready', flush=True)\n"
            "sys.stdin.read()\n"
            "for p in ps: p.kill(); p.wait()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout.readline() == "ready\n"
        assert len(scan.descendants(parent.pid)) == 1000
        scanner = scan.Scanner(parent.pid)
        assert len(scanner.descendants()) == 1000
        assert len(scanner.descendants()) == 1000  # again, through the held files
        scanner.close()
    finally:
        parent.communicate("", timeout=60)
