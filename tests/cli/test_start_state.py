"""`ccsup start` and its state directory: a state directory that cannot be
written is named as such (exit 2), and a start whose supervisor is up but not answering yet (it
is restoring a queue) waits for it instead of failing after the first 1 s status request."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

import pytest
from cli_daemon import CCSUP, FAST, ccsup
from conftest import wait_until

from guardd import procs
from supervisor.client import Client


@pytest.fixture
def read_only_dir(tmp_path):
    """A directory on a tmpfs mounted read-only (root and CAP_SYS_ADMIN needed, else skip)."""
    mount = tmp_path / "ro"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
                          capture_output=True)  # fmt: skip
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
    try:
        (mount / "state").mkdir(mode=0o700)
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


@pytest.mark.parametrize("foreground", [False, True])
def test_a_state_dir_that_cannot_be_written_is_named_and_exits_2(read_only_dir, foreground):
    for state in (read_only_dir / "state", read_only_dir / "new"):
        args = ["start", "--foreground"] if foreground else ["start"]
        done = ccsup(*args, state_dir=state)
        assert (done.returncode, done.stderr) == (
            2,
            f"ccsup: the state directory {state} is not writable (read-only file system): ccsup "
            "keeps its locks, queue and sockets there; choose another with --state-dir or "
            "$CCSUP_STATE_DIR\n",
        )


def test_start_waits_for_a_supervisor_that_is_up_but_not_answering_yet(state_dir):
    pytest.importorskip("supervisor.daemon.main")
    (state_dir / "ccsup.toml").write_text(FAST + "[slots]\ncaps = { t = 1 }\n")
    env = {**os.environ, "CCSUP_STATE_DIR": str(state_dir)}
    env["CCSUP_CONFIG"] = str(state_dir / "ccsup.toml")
    starter = subprocess.Popen([*CCSUP, "start"], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    daemon = None
    try:
        lock, control = state_dir / "supervisor.lock", state_dir / "control"

        def daemon_bound() -> procs.Identity | None:
            text = lock.read_text().strip() if lock.exists() else ""
            return procs.identity_of(int(text)) if text and control.exists() else None

        daemon = wait_until(daemon_bound, timeout=20, interval=0.002, what="the daemon bound")
        # Bound, holding its lock: now it answers nothing for 3 s, as while restoring a queue.
        procs.signal_process(daemon, signal.SIGSTOP)
        if starter.poll() is not None:
            pytest.skip(
                "the start returned before its supervisor could be stopped (a fast machine)"
            )
        time.sleep(3.0)  # the state under test: a start that sees no answer for 3 s
        assert starter.poll() is None, starter.communicate()
        procs.signal_process(daemon, signal.SIGCONT)
        out, err = starter.communicate(timeout=30)
        assert starter.returncode == 0, err
        assert out.startswith(f"ccsup started (pid {daemon.pid}, state {state_dir})")
        assert "is restoring its queue; waiting for it to answer" in err
        with Client(state_dir) as client:
            assert client.status()["pid"] == daemon.pid
    finally:
        if daemon is not None and procs.process_running(daemon):
            procs.signal_process(daemon, signal.SIGCONT)
        if starter.poll() is None:
            starter.kill()
            starter.communicate()
        ccsup("stop", "--timeout", "10s", state_dir=state_dir)
        if daemon is not None and procs.process_running(daemon):
            procs.signal_process(daemon, signal.SIGKILL)


def test_after_a_sigkill_the_advice_starts_it_as_it_was_and_restart_keeps_its_config(tmp_path):
    """A supervisor started with `--caps` on the embedded defaults: once SIGKILLed, `status`
    advises `ccsup start --caps ...`, not a bare start that would lose the caps; and `ccsup
    restart` keeps the embedded defaults even though a config file appeared since."""
    state_dir = tmp_path / "s"
    xdg = tmp_path / "xdg"
    env = {k: v for k, v in os.environ.items() if k not in ("CCSUP_CONFIG", "NO_COLOR")}
    env |= {"CCSUP_STATE_DIR": str(state_dir), "XDG_CONFIG_HOME": str(xdg)}
    env["CCSUP_GUARD_GRACE_MS"] = "300"

    def run(*args):
        return subprocess.run([*CCSUP, *args], env=env, capture_output=True, text=True, timeout=60)

    started = run("start", "--caps", "codex=2")
    assert started.returncode == 0, started.stderr
    pid = int(started.stdout.split("(pid ")[1].split(",")[0])
    try:
        (xdg / "ccsup").mkdir(parents=True)
        (xdg / "ccsup" / "ccsup.toml").write_text(
            '[slots]\ndefault_cap = 7\n[guard]\nadopt_within = "5s"\n'
        )
        restarted = run("restart")
        assert restarted.returncode == 0, restarted.stderr
        status = run("status")
        assert "config  <embedded defaults>" in status.stdout, status.stdout
        pid = int(run("status", "--json").stdout.split('"pid": ')[1].split(",")[0])
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: procs.read_stat(pid) is None or procs.read_stat(pid).zombie, what="gone")
        gone = run("status")
        assert gone.returncode == 3
        assert gone.stderr == (
            f"ccsup: no supervisor is running on {state_dir}; start one with "
            "`ccsup start --caps codex=2`\n"
        )
    finally:
        run("stop")  # whichever supervisor runs now (a failed check may leave the restarted one)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_a_state_dir_made_with_mkdir_is_made_private_by_start_and_config_check_says_so(state_dir):
    """`mkdir` (umask 022) makes 755: empty and ours, start makes it 700 itself and config check
    says it will; with something in it (its names readable by others) both refuse it alike.
    config check shows adopt_within."""
    config = state_dir / "ccsup.toml"
    config.write_text(FAST)
    state = state_dir / "s"  # short: ipc:// paths in it
    state.mkdir()
    state.chmod(0o755)
    checked = ccsup("--config", str(config), "config", "check", state_dir=state)
    assert checked.returncode == 0, checked.stderr
    assert f"  state_dir        {state} (mode 755: start makes it 700)\n" in checked.stdout
    assert "  adopt_within     0s\n" in checked.stdout, checked.stdout
    try:
        started = ccsup("--config", str(config), "start", state_dir=state)
        assert started.returncode == 0, started.stderr
        assert os.stat(state).st_mode & 0o777 == 0o700
    finally:
        ccsup("--config", str(config), "stop", "--timeout", "10", state_dir=state)
    other = state_dir / "o"
    other.mkdir()
    other.chmod(0o755)
    (other / "something").write_text("x")
    checked = ccsup("--config", str(config), "config", "check", state_dir=other)
    started = ccsup("--config", str(config), "start", state_dir=other)
    refusal = f"refusing state directory {other}: group or others may read or enter it (mode 755)"
    assert (checked.returncode, started.returncode) == (2, 1), (checked.stderr, started.stderr)
    assert refusal in checked.stderr and refusal in started.stderr, (checked.stderr, started.stderr)
    assert os.stat(other).st_mode & 0o777 == 0o755
