"""The guard, black-box: real guards (`python -m guardd`) running real process trees.

Each CMD announces every process it starts (`<role> <pid> <start> <pgid>`, see tests/helpers/guard_cmds.py)
on the guard's stdout; tests act only after reading those lines, never after a fixed sleep.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
from conftest import PYTHON, wait_until
from guard_run import CMDS, GRACE, GuardRun, gone, py  # noqa: E402,F401

from guardd import procs, record

# 1. Exit status ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "script, code, sig",
    [
        ("exit 0", 0, None),
        ("exit 1", 1, None),
        ("exit 7", 7, None),
        ("exit 42", 42, None),
        ("exit 255", 255, None),
        ("kill -TERM $$", None, 15),
        ("kill -KILL $$", None, 9),
        ("kill -SEGV $$", None, 11),
        ("kill -INT $$", None, 2),
    ],
)
def test_exit_status_is_cmds(tmp_path, script, code, sig):
    g = GuardRun(tmp_path, ["sh", "-c", script])
    rc = g.wait()
    assert rc == (code if sig is None else 128 + sig)
    rec = g.record()
    assert rec["exit"] == {"code": code, "signal": sig}
    assert rec["state"] == "gone"


def test_command_not_found_is_127(tmp_path):
    g = GuardRun(tmp_path, ["/nonexistent/ccsup-no-such-cmd"])
    assert g.wait() == 127
    rec = g.record()
    assert rec["exit"] == {"code": 127, "signal": None}
    assert rec["own_group"] is None and rec["state"] == "gone"
    assert rec["reason"].startswith("not_found:")


def test_command_on_path_not_found_is_127(tmp_path):
    assert GuardRun(tmp_path, ["ccsup-no-such-command-anywhere"]).wait() == 127


@pytest.mark.parametrize("kind", ["not-executable-file", "directory"])
def test_command_not_executable_is_126(tmp_path, kind):
    target = tmp_path / "target"
    if kind == "directory":
        target.mkdir()
    else:
        target.write_text("#!/bin/sh\nexit 0\n")
        target.chmod(0o644)
    g = GuardRun(tmp_path, [str(target)])
    assert g.wait() == 126
    assert g.record()["reason"].startswith("not_executable:")


@pytest.mark.parametrize("action", ["exit-after-orphan", "orphan-exits-first"])
def test_orphans_reaped_by_the_guard_do_not_steal_cmds_status(tmp_path, action):
    # The guard reaps orphans with waitpid(-1) too; only CMD's own status may come back.
    g = GuardRun(tmp_path, py(action, "9"))
    assert g.wait() == 9
    assert g.record()["exit"] == {"code": 9, "signal": None}


# 2. A setsid child that ignores SIGTERM ---------------------------------------------------------


def test_setsid_child_ignoring_sigterm_is_killed_after_grace_and_guard_waits(tmp_path):
    g = GuardRun(tmp_path, py("setsid-child", "3"))
    child, child_pgid = g.announced("child")
    g.announced("ready")
    assert child_pgid == child.pid
    rc = g.wait()
    assert rc == 3
    assert gone(child)  # the guard exited only after the child was gone
    assert g.elapsed >= GRACE  # it ignored SIGTERM: only the SIGKILL after the grace ended it
    rec = g.record()
    assert {"pgid": child.pid, "leader_start": child.start} in [
        {"pgid": x["pgid"], "leader_start": x["leader_start"]} for x in rec["groups"]
    ]
    assert rec["state"] == "gone" and rec["exit"] == {"code": 3, "signal": None}
    assert rec["reason"] == "exited"


# 3. A daemon detaching between two scans: only the subreaper sees it ---------------------------


@pytest.mark.parametrize("how", ["cmd-exits", "guard-sigterm"])
def test_double_forked_daemon_between_scans_is_ended(tmp_path, how):
    # --scan 30s: no periodic scan runs during the test, so the daemon (whose middle process is
    # gone) is found only because it was reparented to the guard, the child subreaper.
    stay = ["stay"] if how == "guard-sigterm" else []
    g = GuardRun(tmp_path, py("daemon", *stay), scan="30s")
    daemon, daemon_pgid = g.announced("daemon")
    g.announced("ready")
    if how == "guard-sigterm":
        g.proc.send_signal(signal.SIGTERM)
    rc = g.wait()
    assert rc == (0 if how == "cmd-exits" else 128 + signal.SIGTERM)
    assert gone(daemon)
    groups = g.record()["groups"]
    assert [(x["pgid"], x["leader_start"]) for x in groups] == [(daemon_pgid, None)]


# 4. The guard's parent SIGKILLed ------------------------------------------------------------------

LAUNCHER = (
    "import subprocess, sys, os\n"
    "p = subprocess.Popen(sys.argv[1:])\n"
    "os.write(1, f'guard {p.pid}\\n'.encode())\n"
    "p.wait()\n"
)


def test_parent_sigkilled_ends_all_work_within_grace(tmp_path):
    g = GuardRun(
        tmp_path,
        py("setsid-child", "stay"),
        grace=0.5,
        scan="30s",
        launcher=[PYTHON, "-c", LAUNCHER],
    )
    guard_pid = int(g.line()[1])
    guard = procs.identity_of(guard_pid)
    child, _ = g.announced("child")
    cmd, _ = g.announced("ready")
    g.proc.kill()  # the launcher: the guard's parent
    killed_at = time.monotonic()
    g.wait()
    wait_until(
        lambda: gone(child) and gone(cmd) and gone(guard),
        timeout=0.5 + 1.0,
        what="CMD, its setsid child and the guard gone after the parent's SIGKILL",
    )
    assert time.monotonic() - killed_at >= 0.5  # the child ignored SIGTERM: the grace ran out
    rec = record.read_json(record.record_path(g.record_dir, guard))
    assert rec["state"] == "gone" and rec["reason"] == "parent_gone"
    assert rec["exit"] == {"code": None, "signal": signal.SIGTERM}


# 5. Signals to the guard; a stopped CMD ----------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signal_to_guard_stops_the_turn(tmp_path, sig):
    g = GuardRun(tmp_path, py("setsid-child", "stay"))
    child, _ = g.announced("child")
    cmd, _ = g.announced("ready")
    g.proc.send_signal(sig)
    assert g.wait() == 128 + signal.SIGTERM  # CMD died of the guard's SIGTERM
    assert gone(child) and gone(cmd)
    rec = g.record()
    assert rec["reason"] == f"signal:{signal.Signals(sig).name}"
    assert rec["state"] == "gone"


def test_stopped_cmd_is_still_ended_without_waiting_for_the_grace(tmp_path):
    g = GuardRun(tmp_path, py("sleep"), grace=5)
    cmd, _ = g.announced("ready")
    assert procs.signal_process(cmd, signal.SIGSTOP)
    wait_until(lambda: procs.read_stat(cmd.pid).state == "T", what="CMD stopped")
    sent = time.monotonic()
    g.proc.send_signal(signal.SIGTERM)
    # SIGCONT follows SIGTERM, so the stopped CMD sees it at once, long before the 5 s grace.
    assert g.wait() == 128 + signal.SIGTERM
    assert time.monotonic() - sent < 2.0
    assert gone(cmd)


# 6. The guard SIGKILLed: the record remains for a reaper --------------------------------------


def test_guard_sigkilled_leaves_record_with_live_groups(tmp_path):
    g = GuardRun(tmp_path, py("setsid-child", "stay"))
    child, child_pgid = g.announced("child")
    cmd, _ = g.announced("ready")
    wanted = {"pgid": child_pgid, "leader_start": child.start}

    def recorded():
        try:
            rec = g.record()
        except (ValueError, FileNotFoundError):
            return None
        return rec if wanted in [{k: x[k] for k in wanted} for x in rec["groups"]] else None

    wait_until(recorded, what="the setsid child's group in the record")
    g.proc.kill()
    g.wait()
    rec = g.record()
    assert rec["state"] == "running" and rec["exit"] is None
    assert rec["own_group"] == {"pgid": cmd.pid, "leader_start": cmd.start}
    groups = record.record_groups(rec)
    assert procs.Group(child_pgid, child.start) in groups
    assert record.groups_alive(rec)
    assert all(procs.group_alive(grp) for grp in groups)
    for grp in groups:
        os.killpg(grp.pgid, signal.SIGKILL)
    wait_until(lambda: not record.groups_alive(rec), what="the groups gone after SIGKILL")
    assert not any(procs.group_alive(grp) for grp in groups)


# 8. Job control and a large tree ---------------------------------------------------------------


def test_job_control_shell_is_ended_completely(tmp_path):
    # after its jobs die the shell execs a sleep in the own group: CMD dies of SIGTERM either way
    script = "set -m; sleep 300 & a=$!; sleep 300 & echo ready $a $!; wait; exec sleep 300"
    g = GuardRun(tmp_path, ["bash", "-c", script])
    words = g.line()
    assert words[0] == "ready"
    sleeps = [procs.identity_of(int(p)) for p in words[1:]]
    # set -m: each job is a group of its own, not the own group
    assert all(procs.read_stat(s.pid).pgid == s.pid for s in sleeps)
    g.proc.send_signal(signal.SIGTERM)
    assert g.wait() == 128 + signal.SIGTERM
    assert all(gone(s) for s in sleeps)
    recorded = {x["pgid"] for x in g.record()["groups"]}
    assert recorded == {s.pid for s in sleeps}


@pytest.mark.timeout(90)
def test_forking_tree_of_hundreds_is_ended_completely(tmp_path):
    fanout, depth = 6, 3
    total = fanout + fanout**2 + fanout**3  # 258
    g = GuardRun(tmp_path, py("tree", str(fanout), str(depth)), scan="0.2")
    nodes = [g.announced("node")[0] for _ in range(total)]
    cmd, _ = g.announced("ready")
    assert len({n.pid for n in nodes}) == total
    g.proc.send_signal(signal.SIGTERM)
    assert g.wait(60) == 128 + signal.SIGTERM
    left = [n for n in nodes if not gone(n)]
    assert left == [] and gone(cmd)


# Start conditions: signal mask, dispositions, environment, record -----------------------------

BLOCKING_LAUNCHER = (
    "import os, signal, sys\n"
    "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGUSR1, signal.SIGCHLD,"
    " signal.SIGINT})\n"
    "for s in (signal.SIGUSR2, signal.SIGHUP, signal.SIGCHLD, signal.SIGQUIT):\n"
    "    signal.signal(s, signal.SIG_IGN)\n"
    "os.execv(sys.argv[1], sys.argv[1:])\n"
)


def _status_fields(text: str) -> dict:
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


def test_cmd_starts_with_empty_mask_and_default_dispositions(tmp_path):
    g = GuardRun(tmp_path, ["cat", "/proc/self/status"], launcher=[PYTHON, "-c", BLOCKING_LAUNCHER])
    out = g.proc.stdout.read().decode()
    assert g.wait() == 0  # with SIGCHLD blocked and ignored in its parent, the guard still reaps
    fields = _status_fields(out)
    assert fields["SigBlk"] == "0" * 16
    assert fields["SigIgn"] == "0" * 16


def test_guard_started_with_signals_blocked_still_stops_on_sigterm(tmp_path):
    g = GuardRun(tmp_path, py("sleep"), launcher=[PYTHON, "-c", BLOCKING_LAUNCHER])
    cmd, pgid = g.announced("ready")
    assert pgid == cmd.pid  # a group of its own
    g.proc.send_signal(signal.SIGTERM)
    assert g.wait() == 128 + signal.SIGTERM
    assert gone(cmd)


def test_cmd_gets_the_turn_in_its_environment_and_the_record_is_exact(tmp_path):
    env = dict(os.environ, CCSUP_SECRET_FOR_TEST="s3cr3t")
    g = GuardRun(
        tmp_path,
        ["sh", "-c", 'echo "turn $CCSUP_TURN $CCSUP_SECRET_FOR_TEST"'],
        "--turn",
        "t-42",
        env=env,
    )
    assert g.line() == ["turn", "t-42", "s3cr3t"]
    assert g.wait() == 0
    path = g.record_path()
    rec = g.record()
    assert set(rec) == {
        "v",
        "guard",
        "turn",
        "argv",
        "cwd",  # the turn's working directory, where the guard was started
        "own_group",
        "groups",
        "state",
        "exit",
        "exited_at",  # when CMD was reaped (epoch): the turn's end is dated by it
        "reason",
        "started_at",
        "cgroup",
        "usage",
    }
    assert rec["v"] == 1 and rec["turn"] == "t-42"
    assert rec["guard"]["pid"] == g.proc.pid
    assert path.name == f"{rec['guard']['pid']}-{rec['guard']['start']}.json"
    assert rec["argv"] == ["sh", "-c", 'echo "turn $CCSUP_TURN $CCSUP_SECRET_FOR_TEST"']
    assert rec["cwd"] == os.getcwd()
    assert rec["own_group"]["pgid"] != g.proc.pid
    assert rec["groups"] == [] and rec["state"] == "gone"
    assert rec["cgroup"] is None  # no --cgroup: subreaper and groups only
    assert set(rec["usage"]) == {
        "cpu_user_s",
        "cpu_system_s",
        "peak_rss_bytes",
        "processes",
        "mem",
        "peak_mem",
    }
    assert rec["usage"]["processes"] >= 1
    assert "s3cr3t" not in path.read_text()  # the environment is never written
    assert os.listdir(g.record_dir) == [path.name]  # its last version took the spare's place
    assert abs(rec["started_at"] - time.time()) < 30
    assert rec["started_at"] <= rec["exited_at"] <= time.time()


def test_without_turn_an_id_is_made_and_given_to_cmd(tmp_path):
    g = GuardRun(tmp_path, ["sh", "-c", 'echo "turn $CCSUP_TURN"'])
    words = g.line()
    assert g.wait() == 0
    assert words[0] == "turn" and len(words) == 2 and words[1]
    assert g.record()["turn"] == words[1]


def test_cmd_gets_the_scope_marker_and_the_callers_fd_limit(tmp_path):
    """CCSUP_SCOPE names the record directory (the reaper of this state directory only ends
    marked escapees of its own scope); CCSUP_GUARD_NOFILE is CMD's soft RLIMIT_NOFILE back (the
    supervisor raised its own) and never reaches CMD."""
    env = dict(os.environ, CCSUP_GUARD_NOFILE="200")
    script = 'echo "$CCSUP_SCOPE ${CCSUP_GUARD_NOFILE:-unset} $(ulimit -Sn)"'
    g = GuardRun(tmp_path, ["sh", "-c", script], env=env)
    words = g.line()
    assert g.wait() == 0
    assert words == [record.record_dir_scope(g.record_dir), "unset", "200"]


def test_environment_gives_record_dir_and_grace(tmp_path):
    env = dict(
        os.environ,
        CCSUP_GUARD_DIR=str(tmp_path / "envdir"),
        CCSUP_GUARD_GRACE_MS="300",
        CCSUP_GUARD_SCAN_MS="100",
    )
    proc = subprocess.Popen(
        [PYTHON, "-m", "guardd", "--", *py("setsid-child", "0")], stdout=subprocess.PIPE, env=env
    )
    out = proc.stdout.readline().split()
    started = time.monotonic()
    assert proc.wait(10) == 0
    assert 0.3 <= time.monotonic() - started < 3  # the 300 ms grace from the environment
    proc.stdout.close()
    assert gone(procs.Identity(int(out[1]), int(out[2])))
    (path,) = (tmp_path / "envdir").glob("*.json")
    assert record.read_json(path)["state"] == "gone"


def test_no_record_without_a_record_dir(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "CCSUP_GUARD_DIR"}
    proc = subprocess.run([PYTHON, "-m", "guardd", "--", "true"], env=env, cwd=tmp_path, timeout=10)
    assert proc.returncode == 0
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--grace", "soon", "--", "true"],
        ["--bogus", "true"],
        ["--grace"],
        ["--scan", "0", "--", "true"],
    ],
)
def test_usage_errors_exit_125(args):
    proc = subprocess.run([PYTHON, "-m", "guardd", *args], capture_output=True, timeout=10)
    assert proc.returncode == 125
    assert b"usage: ccsup-guard" in proc.stderr


def test_guard_imports_only_the_standard_library():
    code = (
        "import guardd.__main__, guardd.guard, guardd.scan, guardd.linux, guardd.record, sys;"
        "bad = [m for m in ('zmq', 'psutil', 'click') if m in sys.modules];"
        "assert not bad, bad"
    )
    subprocess.run([PYTHON, "-c", code], check=True, timeout=10)


def test_launch_command_skips_site_and_ignores_a_guardd_in_cwd(tmp_path):
    from guardd.launch import guard_command

    (tmp_path / "guardd.py").write_text("raise SystemExit('shadowed')\n")
    command = guard_command(
        ["--record-dir", str(tmp_path / "rec"), "--", PYTHON, "-c", "import sys; sys.exit(6)"]
    )
    assert command[1:4] == ["-I", "-S", "-c"]
    proc = subprocess.run(command, cwd=tmp_path, capture_output=True, timeout=10)
    assert (proc.returncode, proc.stderr) == (6, b"")
    (rec,) = (tmp_path / "rec").glob("*.json")
    assert json.loads(rec.read_text())["exit"] == {"code": 6, "signal": None}


def test_the_record_says_stopping_through_both_stopping_phases(tmp_path):
    """The guard's one Phase (running, terminating, killing, gone) is written as the record's
    `state` the supervisor reads: "stopping" through the grace and after it, as before."""
    g = GuardRun(tmp_path, py("setsid-child", "stay"), grace=30)
    child, _ = g.announced("child")  # in a session of its own; ignores SIGTERM
    g.announced("ready")
    g.proc.send_signal(signal.SIGTERM)

    def stopping():
        try:
            rec = g.record()
        except (ValueError, FileNotFoundError):  # between a rewrite's two files
            return None
        return rec if rec["state"] == "stopping" else None

    rec = wait_until(stopping, what="the record saying stopping")
    assert rec["reason"] == "signal:SIGTERM" and not gone(child)  # the grace runs: terminating
    g.proc.kill()  # a guard killed while stopping leaves its record saying so
    g.wait()
    assert g.record()["state"] == "stopping"
    procs.signal_process(child, signal.SIGKILL)
    wait_until(lambda: gone(child), what="the setsid child ended")
