"""`ccsup` run as a user runs it, and a real supervisor started by `ccsup start` on a test's own
state directory (the `cli_daemon` fixture: import `cli_daemon_fixture` into a test module), always stopped after: `ccsup stop`, then SIGKILL by
pid if it is still there."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from guardd import procs

CCSUP = [sys.executable, "-m", "supervisor"]
FAST = """\
[guard]
grace = "300ms"
scan = "200ms"
adopt_within = "0s"
"""


def ccsup(*args: str, state_dir: Path, timeout: float = 30, **kw) -> subprocess.CompletedProcess:
    """`ccsup ARGS` on `state_dir` (its ccsup.toml as the config when there), text output."""
    env = dict(kw.pop("env", None) or os.environ)
    env.pop("CCSUP_CONFIG", None)
    env.pop("NO_COLOR", None)
    env["CCSUP_STATE_DIR"] = str(state_dir)
    env["XDG_CONFIG_HOME"] = str(state_dir / "no-config")
    if (state_dir / "ccsup.toml").exists():
        env["CCSUP_CONFIG"] = str(state_dir / "ccsup.toml")
    return subprocess.run(
        [*CCSUP, *args], env=env, capture_output=True, text=True, timeout=timeout, **kw
    )


@pytest.fixture(name="cli_daemon")
def cli_daemon_fixture(state_dir):
    """cli_daemon(config_text, *start_args) -> state_dir, with a supervisor running on it."""
    pytest.importorskip("supervisor.daemon.main")
    pids = []

    def start(config_text: str = "", *start_args: str) -> Path:
        # A config with a [guard] table of its own says all of it (TOML takes a table once).
        own_guard = "[guard]" in config_text
        (state_dir / "ccsup.toml").write_text(config_text if own_guard else FAST + config_text)
        started = ccsup("start", *start_args, state_dir=state_dir)
        assert started.returncode == 0, started.stderr
        pids.append(procs.identity_of(int(started.stdout.split("(pid ")[1].split(",")[0])))
        return state_dir

    yield start
    if pids:
        ccsup("stop", "--timeout", "10", state_dir=state_dir)
    for ident in pids:
        if ident is not None and procs.process_running(ident):
            procs.signal_process(ident, signal.SIGKILL)
