"""contrib/: the Node sidecar's own tests, the systemd notify protocol, and shell completion.

The Node tests run with node's test runner against a real supervisor that they start in a temporary
state directory (with this interpreter, through $CCSUP_PYTHON); they are skipped only where `node`
or the installed npm package (`npm ci` in contrib/node-sidecar, as .ci/run does) is missing.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time

import pytest
from conftest import PYTHON, ROOT, write_config

SIDECAR = ROOT / "contrib" / "node-sidecar"
NODE = shutil.which("node")


# -- the Node sidecar ------------------------------------------------------------------------------


@pytest.mark.timeout(180)
@pytest.mark.xdist_group("harness")  # node, CPU-hungry: one at a time with the real harnesses
def test_node_sidecar_tests_pass_against_a_real_supervisor():
    if NODE is None:
        pytest.skip("node is not installed: the Node sidecar's tests cannot run")
    if not (SIDECAR / "node_modules" / "zeromq").is_dir():
        pytest.skip(f"the zeromq npm package is not installed: run `npm ci` in {SIDECAR}")
    env = {**os.environ, "CCSUP_PYTHON": PYTHON}
    proc = subprocess.run(
        [NODE, "--test", "--test-force-exit", "test/sidecar.test.js"],
        cwd=SIDECAR,
        env=env,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert "# fail 0" in proc.stdout
    passed = re.search(r"^# pass (\d+)$", proc.stdout, re.M)
    assert passed and int(passed.group(1)) >= 14, proc.stdout[-3000:]  # none skipped or lost


# -- systemd: the notify protocol ------------------------------------------------------------------


def _recv_all(sock: socket.socket, timeout: float) -> list[str]:
    sock.settimeout(timeout)
    try:
        return [sock.recv(4096).decode()]
    except TimeoutError:
        return []


@pytest.mark.parametrize("abstract", [False, True], ids=["path", "abstract"])
def test_under_systemd_ready_comes_once_status_answers_and_stopping_after_quit(state_dir, abstract):
    from supervisor.client import Client

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if abstract:  # systemd may hand an abstract address, written with a leading "@"
        name = f"ccsup-test-notify-{os.getpid()}-{time.monotonic_ns()}"
        sock.bind("\0" + name)
        notify = "@" + name
    else:
        notify = str(state_dir / "notify")
        sock.bind(notify)
    config = write_config(state_dir)
    env = {**os.environ, "NOTIFY_SOCKET": notify}
    with open(state_dir / "daemon.stderr", "wb") as err:
        proc = subprocess.Popen(
            [
                PYTHON,
                "-m",
                "supervisor",
                "--state-dir",
                str(state_dir),
                "--config",
                str(config),
                "start",
                "--foreground",
            ],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=err,
            stderr=err,
        )
    try:
        messages = _recv_all(sock, 20.0)
        assert messages == ["READY=1"]
        # READY means ready: status answers at once, with no retry.
        with Client(state_dir, timeout=2.0) as client:
            assert client.status()["pid"] == proc.pid
            assert _recv_all(sock, 0.2) == []  # nothing else while it runs
            # a turn does not inherit the notify socket (it could tell systemd anything)
            events = list(client.run_turn("codex", ["sh", "-c", 'echo "[$NOTIFY_SOCKET]"']))
            assert "".join(b["data"] for t, b in events if t.endswith(".stdout")) == "[]\n"
            assert client.quit() == {"stopping": True}
        assert _recv_all(sock, 10.0) == ["STOPPING=1"]
        assert proc.wait(20) == 0
        assert _recv_all(sock, 0.2) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sock.close()


def test_the_unit_runs_the_daemon_in_the_foreground_as_type_notify_and_hands_over_on_stop():
    unit = (ROOT / "contrib" / "systemd" / "ccsup.service").read_text()
    settings = dict(
        line.split("=", 1) for line in unit.splitlines() if "=" in line and not line.startswith("#")
    )
    assert settings["Type"] == "notify"
    assert settings["ExecStart"].endswith("ccsup start --foreground")
    # a stop or restart of the unit is a hand-over (tests/cli/test_restart_command.py): only the daemon
    # is signalled, and with the hand-over signal, so the turns' guards wait to be adopted
    from supervisor.daemon.main import HAND_OVER_SIGNAL

    assert settings["KillMode"] == "process"
    assert signal.Signals[settings["KillSignal"]] == HAND_OVER_SIGNAL == signal.SIGUSR2
    assert int(settings["TimeoutStopSec"]) >= 30


# -- shell completion ------------------------------------------------------------------------------

CCSUP = (
    str(ROOT / ".venv" / "bin" / "ccsup")
    if (ROOT / ".venv" / "bin" / "ccsup").exists()
    else shutil.which("ccsup")
)


@pytest.mark.parametrize(
    "shell, opening",
    [
        ("bash", "_ccsup_completion() {"),
        ("zsh", "#compdef ccsup"),
        ("fish", "function _ccsup_completion;"),
    ],
)
def test_completion_script_for_each_shell(shell, opening):
    proc = subprocess.run(
        [CCSUP],
        env={**os.environ, "_CCSUP_COMPLETE": f"{shell}_source"},
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == opening
    assert "_CCSUP_COMPLETE" in proc.stdout


def test_completion_offers_the_commands_that_match():
    env = {
        **os.environ,
        "_CCSUP_COMPLETE": "bash_complete",
        "COMP_WORDS": "ccsup st",
        "COMP_CWORD": "1",
    }
    proc = subprocess.run([CCSUP], env=env, capture_output=True, text=True, timeout=20)
    assert proc.stdout.split() == ["plain,start", "plain,status", "plain,stop"]
