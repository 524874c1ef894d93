"""cgroup v2 containment, where a writable cgroup2 hierarchy exists (skipped cleanly elsewhere):
CMD runs inside its turn's cgroup from its first instruction, the end is cgroup.kill, gone is
`populated 0`, and work nothing else knows of (no recorded group, no turn marker) is ended by its
cgroup when guard and supervisor were both killed outright."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import PYTHON, wait_until, zygote_of

from guardd import cgroup, procs
from guardd.launch import guard_command
from supervisor import config as cfg
from supervisor.cli.config import config_group
from supervisor.guards import containment

BASE = cgroup.find_auto()
needs_cgroup2 = pytest.mark.skipif(BASE is None, reason="no writable cgroup2 hierarchy here")

# A child that leaves the turn's group and session, drops its environment (no CCSUP_TURN marker)
# and ignores SIGTERM: only SIGKILL ends it, and only a cgroup knows it once nobody recorded it.
HIDDEN = (
    "setsid env -i sh -c 'trap \"\" TERM; echo $$ > {pidfile}; exec sleep 300' & "
    "cat /proc/self/cgroup > {cgfile}; exec sleep 300"
)


@pytest.fixture
def test_cgroup():
    if BASE is None:
        pytest.skip("no writable cgroup2 hierarchy here")
    """A cgroup path for one test (`ccsup.test.<uuid>`), removed afterwards."""
    path = os.path.join(BASE, f"ccsup.test.{uuid.uuid4().hex[:8]}")
    yield path
    for sub in sorted(Path(path).glob("**/"), key=lambda p: -len(p.parts)):
        cgroup.kill(str(sub))
        cgroup.wait_empty(str(sub), 5)
        cgroup.remove(str(sub))


@pytest.fixture
def hidden():
    """Pid files of hidden children (no test marker: the leftover check cannot see them); each is
    killed by identity after the test, whatever happened."""
    files: list[Path] = []
    yield files
    for path in files:
        if path.exists() and path.read_text().strip():
            pid = int(path.read_text())
            stat = procs.read_stat(pid)
            if stat is not None and not stat.zombie:
                procs.signal_process(procs.Identity(pid, stat.start), signal.SIGKILL)


@pytest.fixture
def ended():
    """Guards a test started directly: killed after it if still running."""
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait()


def slot_work(state_dir: Path) -> dict | None:
    return json.loads((state_dir / "slots" / "codex" / "slot-0.json").read_text())["work"]


def read_pid(path: Path) -> int:
    return int(wait_until(lambda: path.exists() and path.read_text().strip(), what=str(path)))


@needs_cgroup2
def test_cmd_runs_in_its_cgroup_from_the_start_and_a_stubborn_child_ends_by_cgroup_kill(
    test_cgroup, tmp_path, hidden, ended
):
    turn = os.path.join(test_cgroup, "turn.t1")
    pidfile, cgfile = tmp_path / "child.pid", tmp_path / "cgroup"
    guard = subprocess.Popen(
        guard_command(["--record-dir", str(tmp_path), "--grace", "0.3", "--cgroup", turn, "--"])
        + ["sh", "-c", HIDDEN.format(pidfile=pidfile, cgfile=cgfile)],
        start_new_session=True,
    )
    hidden.append(pidfile)
    ended.append(guard)
    child = procs.identity_of(read_pid(pidfile))
    wait_until(lambda: cgfile.exists() and cgfile.read_text(), what="CMD's cgroup")
    assert f"0::{turn[len(BASE) :]}\n" in cgfile.read_text()  # CMD's first command ran inside
    assert cgroup.populated(turn)
    assert f"{child.pid}\n" in Path(turn, "cgroup.procs").read_text()
    guard.send_signal(signal.SIGTERM)
    assert guard.wait(10) == 128 + signal.SIGTERM
    assert not procs.process_running(child)
    assert not cgroup.populated(turn)
    (record,) = [json.loads(p.read_text()) for p in tmp_path.glob("*.json")]
    assert record["cgroup"] == turn and record["state"] == "gone"


# The guard with the way CMD is started watched: "c" records each child guardd._spawn made (CMD
# cloned in C, born in the cgroup); "born" takes that module away and records each child that
# guardd.linux.fork_into_cgroup made (a fork born in the cgroup); "refused" makes the kernel refuse
# both (ENOSYS, as before Linux 5.7 or under a seccomp filter), so CMD is a plain fork that joins
# the cgroup itself.
FORK_WATCHED = """
import errno, os, sys
sys.path.append({home!r})
from guardd import child, linux
mode = {mode!r}
def logged(real):
    def call(*args):
        pid = real(*args)
        if pid:
            with open({log!r}, "a") as f:
                f.write(f"{{pid}}\\n")
        return pid
    return call
def refused(*args):
    raise OSError(errno.ENOSYS, "refused by the test")
if mode == "c":
    assert child._spawn is not None, "guardd._spawn is not built"
    child._spawn.spawn = logged(child._spawn.spawn)
else:
    child._spawn = None
    linux.fork_into_cgroup = logged(linux.fork_into_cgroup) if mode == "born" else refused
from guardd.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


@needs_cgroup2
@pytest.mark.parametrize("mode", ["c", "born", "refused"])
def test_cmd_is_born_in_its_cgroup_or_joins_it_when_the_kernel_refuses(mode, test_cgroup, tmp_path):
    turn = os.path.join(test_cgroup, "turn.t1")
    log, cgfile = tmp_path / "born", tmp_path / "cgroup"
    script = FORK_WATCHED.format(
        home=str(Path(cgroup.__file__).parents[1]), log=str(log), mode=mode
    )
    guard = subprocess.run(
        [PYTHON, "-I", "-S", "-c", script, "--record-dir", str(tmp_path), "--cgroup", turn, "--"]
        + ["sh", "-c", f"cat /proc/self/cgroup > {cgfile}; echo $$ > {tmp_path / 'cmd'}"],
        capture_output=True,
        timeout=20,
    )
    assert guard.returncode == 0, guard.stderr
    assert f"0::{turn[len(BASE) :]}\n" in cgfile.read_text()  # CMD's first command ran inside
    born = log.read_text().split() if log.exists() else []
    assert born == ([(tmp_path / "cmd").read_text().strip()] if mode != "refused" else [])
    assert not cgroup.populated(turn)


def test_a_cgroup_the_guard_cannot_use_fails_the_guard_and_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    guard = subprocess.run(
        guard_command(["--record-dir", str(tmp_path), "--cgroup", "/proc/self/nonsense", "--"])
        + ["touch", str(marker)],
        capture_output=True,
        timeout=10,
    )
    assert guard.returncode == 125
    assert b"unable to create cgroup /proc/self/nonsense" in guard.stderr
    assert not marker.exists()


def test_auto_without_a_writable_cgroup2_falls_back_and_says_why(monkeypatch):
    monkeypatch.setattr(cgroup, "find_auto", lambda: None)
    found = containment.Cgroups.start("auto", 1, 1)
    assert found.describe() == {
        "containment": "groups",
        "cgroup": None,
        "cgroup_why_not": "no writable cgroup2 hierarchy found (auto): subreaper and process groups",
        "limits": {},
    }
    off = containment.Cgroups.start("off", 1, 1)
    assert off.mode == "groups" and off.parent is None


@needs_cgroup2
def test_supervisor_status_says_cgroup_and_a_turn_runs_in_its_own_removed_after_release(
    daemon, event_log, state_dir, tmp_path, hidden
):
    d = daemon(grace="300ms")
    log = event_log(d)
    client = d.client()
    status = client.status()
    me = procs.identity_of(d.proc.pid)
    parent = os.path.join(BASE, f"ccsup.{me.pid}.{me.start}")
    assert status["containment"] == "cgroup" and status["cgroup"] == parent
    pidfile, cgfile = tmp_path / "child.pid", tmp_path / "cgroup"
    hidden.append(pidfile)
    client.turn("codex", ["sh", "-c", HIDDEN.format(pidfile=pidfile, cgfile=cgfile)], id="t1")
    child = procs.identity_of(read_pid(pidfile))
    turn = os.path.join(parent, "turn.t1")
    wait_until(lambda: cgfile.exists() and cgfile.read_text(), what="CMD's cgroup")
    assert f"0::{turn[len(BASE) :]}\n" in cgfile.read_text()
    slot = json.loads((state_dir / "slots" / "codex" / "slot-0.json").read_text())
    assert slot["work"]["cgroup"] == turn
    client.cancel("t1")
    log.wait_for("turn.t1.released")
    assert not procs.process_running(child)
    assert not os.path.exists(turn)
    client.close()
    assert d.stop() == 0
    assert not os.path.exists(parent)


@needs_cgroup2
def test_work_nobody_recorded_is_ended_by_its_cgroup_after_guard_and_supervisor_die(
    daemon, state_dir, tmp_path, hidden
):
    # scan 60s: the hidden child's group is never recorded (no child of CMD exits to wake a scan)
    d = daemon(grace="300ms", scan="60s")
    client = d.client()
    pidfile, cgfile = tmp_path / "child.pid", tmp_path / "cgroup"
    hidden.append(pidfile)
    client.turn("codex", ["sh", "-c", HIDDEN.format(pidfile=pidfile, cgfile=cgfile)], id="t1")
    child = procs.identity_of(read_pid(pidfile))
    slot = wait_until(  # the cgroup is named first (Slot.name_cgroup), the guard once it runs
        lambda: (slot_work(state_dir) or {}).get("guard") and slot_work(state_dir),
        what="the slot's work",
    )
    guard = procs.identity_of(slot["guard"]["pid"])
    wait_until(Path(slot["record"]).exists, what="the guard's record")  # just after CMD starts
    record = json.loads(Path(slot["record"]).read_text())
    assert all(g["pgid"] != child.pid for g in record["groups"])  # nobody recorded it
    client.close()
    # The zygote too: as the subreaper of its guards' orphans it would end the child itself
    # (guardd.strays); here nothing but the cgroup may still know it.
    zygote = procs.identity_of(zygote_of(d.proc.pid))
    procs.signal_process(guard, signal.SIGSTOP)  # it must not end the work when its parent dies
    procs.signal_process(zygote, signal.SIGKILL)
    d.kill()
    procs.signal_process(guard, signal.SIGKILL)
    wait_until(lambda: not procs.process_running(guard), what="the guard gone")
    wait_until(lambda: not procs.process_running(zygote), what="the zygote gone")
    assert procs.process_running(child)  # only the cgroup still knows it
    d2 = daemon(grace="300ms", scan="200ms")
    wait_until(lambda: not procs.process_running(child), timeout=15, what="the child ended")
    wait_until(lambda: not os.path.exists(slot["cgroup"]), what="the cgroup removed")
    with d2.client() as client:
        assert all(s["state"] == "free" for s in client.ps()["slots"])


@needs_cgroup2
def test_the_unit_delegates_and_auto_puts_turns_beside_the_daemons_leaf(test_cgroup, monkeypatch):
    unit = (Path(__file__).parents[2] / "contrib" / "systemd" / "ccsup.service").read_text()
    settings = dict(
        line.split("=", 1) for line in unit.splitlines() if "=" in line and not line.startswith("#")
    )
    assert settings["Delegate"] == "yes"
    assert settings["DelegateSubgroup"] == cgroup.SUPERVISOR_LEAF
    leaf = os.path.join(test_cgroup, cgroup.SUPERVISOR_LEAF)
    os.makedirs(leaf)
    monkeypatch.setattr(cgroup, "own_cgroup", lambda: leaf[len(BASE) :])
    assert cgroup.find_auto() == test_cgroup


# -- [guard] cgroup in the configuration ---------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [('"auto"', "auto"), ('"off"', "off"), ('"/sys/fs/cgroup/x/"', "/sys/fs/cgroup/x")],
)
def test_the_cgroup_setting_is_auto_off_or_an_absolute_path(value, expected):
    text = f"[guard]\ngrace = '1s'\ncgroup = {value}\n"
    assert cfg.parse(text, "t.toml").guard_cgroup == expected
    assert cfg.parse("", "t.toml").guard_cgroup == "auto"


@pytest.mark.parametrize("value", ['"maybe"', '"relative/path"', "1", "true"])
def test_a_bad_cgroup_setting_is_named_with_its_key_and_line(value):
    with pytest.raises(cfg.ConfigProblems) as info:
        cfg.parse(f"[guard]\ngrace = '1s'\ncgroup = {value}\n", "t.toml")
    (problem,) = info.value.problems
    assert (problem.line, problem.key) == (3, "guard.cgroup")
    assert 'must be "auto", "off" or an absolute path' in problem.message


def test_an_unusable_cgroup_path_fails_config_check_and_start_with_2(tmp_path, state_dir):
    config = tmp_path / "ccsup.toml"
    config.write_text(f'[guard]\ncgroup = "{tmp_path}"\n')  # a directory, not a cgroup
    checked = CliRunner().invoke(config_group, ["check", "--config", str(config)])
    assert checked.exit_code == 2
    assert f"[guard] cgroup: {tmp_path} is not in a cgroup2 hierarchy" in checked.output
    started = subprocess.run(
        [PYTHON, "-m", "supervisor", "--state-dir", str(state_dir), "--config", str(config)]
        + ["start", "--foreground"],
        capture_output=True,
        timeout=30,
    )
    assert started.returncode == 2, started.stderr
    assert f"[guard] cgroup: {tmp_path} is not in a cgroup2 hierarchy" in started.stderr.decode()


def test_off_runs_turns_without_cgroups_and_status_says_so(daemon, event_log):
    d = daemon(grace="300ms", extra="")
    d.config.write_text(d.config.read_text() + 'cgroup = "off"\n')  # under [guard], the last table
    d.stop()
    d.start()
    with d.client() as client:
        status = client.status()
        assert status["containment"] == "groups" and status["cgroup"] is None
        assert status["cgroup_why_not"] == '[guard] cgroup = "off"'
        shown = subprocess.run(
            [PYTHON, "-m", "supervisor", "--state-dir", str(d.state_dir), "status"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
        assert 'contain groups ([guard] cgroup = "off")' in shown.splitlines()
        log = event_log(d)
        client.turn("codex", ["sh", "-c", "cat /proc/self/cgroup"], id="t1")
        log.wait_for("turn.t1.released")
    assert "/turn.t1" not in (d.state_dir / "turns" / "t1" / "stdout.log").read_text()


# -- what a turn used -----------------------------------------------------------------------------

# A grandchild that detaches (setsid + double fork: reparented to the guard), touches 150 MiB and
# burns about 1.2 s of CPU, then writes what it used by its own account (getrusage). CMD waits
# until that grandchild is gone (reaped by the guard), then exits.
BURN = r"""
import os, resource, sys, time
out = sys.argv[1]
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        block = bytearray(150 << 20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        while sum(os.times()[:2]) < 1.2:
            pass
        r = resource.getrusage(resource.RUSAGE_SELF)
        open(out + ".tmp", "w").write(f"{r.ru_utime} {r.ru_stime} {r.ru_maxrss * 1024} {os.getpid()}")
        os.rename(out + ".tmp", out)
        os._exit(0)
    os._exit(0)
os.wait()
while not os.path.exists(out):
    time.sleep(0.01)
pid = int(open(out).read().split()[3])
while os.path.exists(f"/proc/{pid}"):
    time.sleep(0.01)
"""


@pytest.mark.parametrize("mode", ["groups", "cgroup"])
def test_exited_carries_what_the_whole_tree_used_within_20_percent(
    mode, daemon, event_log, tmp_path
):
    if mode == "cgroup" and BASE is None:
        pytest.skip("no writable cgroup2 hierarchy here")
    d = daemon(grace="300ms", extra="")
    if mode == "groups":
        d.config.write_text(d.config.read_text() + 'cgroup = "off"\n')
        d.stop()
        d.start()
    log = event_log(d)
    out = tmp_path / "used"
    with d.client() as client:
        client.turn("codex", [PYTHON, "-c", BURN, str(out)], id="t1")
        exited = log.wait_for("turn.t1.exited", timeout=60)
    user, system, peak, _ = out.read_text().split()
    burned = float(user) + float(system)
    assert exited["code"] == 0
    assert set(exited) >= {"wall_s", "wait_s", "cpu_user_s", "cpu_system_s", "peak_rss_bytes"}
    reported = exited["cpu_user_s"] + exited["cpu_system_s"]
    print(f"{mode}: cpu {burned:.3f} s used, {reported:.3f} s reported;", end=" ")
    print(f"peak {peak} B used, {exited['peak_rss_bytes']} B reported")  # shown with -s
    # the grandchild is most of it; CMD and the middle child add their interpreter starts
    assert burned * 0.8 <= reported <= burned * 1.2 + 0.3, (burned, exited)
    assert int(peak) * 0.8 <= exited["peak_rss_bytes"] <= int(peak) * 1.2, (peak, exited)
    assert exited["processes"] >= 2
    assert exited["wall_s"] >= burned * 0.8 and 0 <= exited["wait_s"] < 5


def test_ps_shows_a_running_turns_usage_so_far(daemon, event_log):
    d = daemon(grace="300ms", scan="200ms")
    log = event_log(d)
    burn = "import os, time\nwhile sum(os.times()[:2]) < 0.5: pass\ntime.sleep(300)"
    with d.client() as client:
        client.turn("codex", [PYTHON, "-c", burn], id="t1")
        log.wait_for("turn.t1.started")

        def usage():
            slot = next(s for s in client.ps()["slots"] if s["turn"] == "t1")
            used = slot.get("usage") or {}
            cpu = used.get("cpu_user_s", 0) + used.get("cpu_system_s", 0)
            return used if cpu and used.get("processes") else None  # after a scan saw CMD

        used = wait_until(usage, what="usage so far in ps")
        assert set(used) == {
            "cpu_user_s",
            "cpu_system_s",
            "peak_rss_bytes",
            "processes",
            "mem",
            "peak_mem",
        }
        assert used["processes"] >= 1
        client.cancel("t1")
        log.wait_for("turn.t1.released")


@needs_cgroup2
def test_a_turns_cgroup_is_in_its_slot_before_its_guard_exists(daemon, state_dir, tmp_path, ended):
    """Killed between a grant and its guard's start (the zygote stopped: no guard yet), the
    supervisor has already named the turn's cgroup in the slot, so a restarted one would see the
    slot orphaned if CMD ran there; the zygote, continued, starts nothing, and the slot is free."""
    d = daemon(grace="300ms")
    zygote = procs.identity_of(zygote_of(d.proc.pid))
    assert zygote is not None
    witness = tmp_path / "ran"
    procs.signal_process(zygote, signal.SIGSTOP)
    try:
        with d.client() as client:
            client.turn("codex", ["touch", str(witness)], id="t1")
            work = wait_until(lambda: slot_work(state_dir), what="the slot's work")
        me = procs.identity_of(d.proc.pid)
        turn = os.path.join(BASE, f"ccsup.{me.pid}.{me.start}", "turn.t1")
        assert work == {"guard": None, "record": None, "groups": [], "cgroup": turn}
        d.kill()
    finally:
        procs.signal_process(zygote, signal.SIGCONT)
    wait_until(lambda: not procs.process_running(zygote), what="the zygote's exit")
    d2 = daemon(grace="300ms")
    with d2.client() as client:
        assert client.ps()["slots"] == []  # nothing taken (free slots are only counted)
    assert not witness.exists()


def test_a_guard_whose_supervisor_has_ended_runs_nothing(tmp_path):
    """The guard's CMD is exec'd only while the process it watches (the supervisor) runs: a guard
    given the pidfd of one that has ended runs nothing, says why and records it."""
    witness = tmp_path / "ran"
    script = f"""
import os, subprocess, sys
sys.path.insert(0, {str(Path(cgroup.__file__).parents[1])!r})
from guardd.__main__ import main
ended = subprocess.Popen(["true"])
fd = os.pidfd_open(ended.pid)
ended.wait()
sys.exit(main(sys.argv[1:], parent_fd=fd))
"""
    guard = subprocess.run(
        [PYTHON, "-c", script, "--record-dir", str(tmp_path), "--", "touch", str(witness)],
        capture_output=True,
        timeout=20,
    )
    assert guard.returncode == 125, guard.stderr
    assert b"the supervisor is gone: CMD was not run" in guard.stderr
    (record,) = [json.loads(p.read_text()) for p in tmp_path.glob("*.json")]
    assert (record["state"], record["reason"]) == ("gone", "parent_gone")
    assert not witness.exists()


def test_cmd_forked_after_its_supervisor_ended_is_not_execd(tmp_path):
    """The check in CMD's child, after it is in its group and cgroup and just before exec: a
    supervisor that dies while CMD is being forked leaves a child that exits 125 unexec'd."""
    from guardd import child

    witness = tmp_path / "ran"
    ended = subprocess.Popen(["true"])
    fd = os.pidfd_open(ended.pid)
    ended.wait()
    try:
        pid, failed = child.start(["touch", str(witness)], dict(os.environ), watch=fd)
    finally:
        os.close(fd)
    assert pid > 0  # forked: the child itself refused
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 125
    assert failed is not None and (failed.code, failed.reason) == (125, "parent_gone")
    assert not witness.exists()


# A holder that names a cgroup as its slot's work (as the supervisor does before a guard starts),
# says so, and is then killed: the lock dies with it, the record stays unreleased.
CGROUP_HOLDER = """
import sys
from pathlib import Path
from supervisor.caps import Caps
from supervisor.slots.gate import Holder, SlotGate
gate = SlotGate(Path(sys.argv[1]), Caps(caps={"codex": 1}))
slot = gate.try_acquire("codex", Holder.this_process(agent="test"), turn="t1")
slot.name_cgroup(sys.argv[2])
print("named", flush=True)
sys.stdin.read()
"""


@needs_cgroup2
@pytest.mark.parametrize("populated", [True, False], ids=["something-runs", "nothing-ran"])
def test_a_slot_whose_work_is_only_its_cgroup_counts_while_anything_runs_there(
    populated, test_cgroup, state_dir, tmp_path, hidden
):
    from supervisor.caps import Caps
    from supervisor.slots.gate import SlotGate

    turn = os.path.join(test_cgroup, "turn.t1")
    cgroup.create(turn)
    env = {**os.environ, "PYTHONPATH": str(Path(cgroup.__file__).parents[1])}
    holder = subprocess.Popen(
        [PYTHON, "-c", CGROUP_HOLDER, str(state_dir), turn],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    assert holder.stdout.readline() == b"named\n"
    holder.kill()
    holder.wait()
    holder.stdin.close()
    holder.stdout.close()
    gate = SlotGate(state_dir, Caps(caps={"codex": 1}))
    if not populated:
        assert [v.state for v in gate.inspect("codex")] == ["free"]
        return
    pidfile = tmp_path / "pid"
    hidden.append(pidfile)
    sleeper = subprocess.Popen(
        ["sh", "-c", f"echo $$ > {turn}/cgroup.procs && echo $$ > {pidfile} && exec sleep 300"],
        start_new_session=True,
    )
    work = procs.identity_of(read_pid(pidfile))
    assert [v.state for v in gate.inspect("codex")] == ["orphaned"]
    assert [v.index for v in gate.reap("codex", grace=0.3)] == [0]
    assert sleeper.wait(5) < 0 and not procs.process_running(work)
    assert [v.state for v in gate.inspect("codex")] == ["free"]
