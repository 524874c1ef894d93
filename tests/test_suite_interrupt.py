"""Ctrl-C (SIGINT) or SIGTERM to a running suite stops it and leaves nothing running: a real pytest
session (tests/helpers/interrupted_session.py: supervisors with a running turn each), interrupted
once every test has its turn running, then no process of that session is left (conftest.py's
session sweep)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from conftest import MARKER, ROOT, wait_until

from guardd import procs


def _marked(prefix: str) -> list[procs.Identity]:
    """Live processes whose CCSUP_TEST_RUN starts with prefix (the session's and its workers')."""
    wanted = f"{MARKER}={prefix}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if any(var.startswith(wanted) for var in environ.split(b"\0")):
            stat = procs.read_stat(int(entry))
            if stat is not None and not stat.zombie:
                found.append(procs.Identity(stat.pid, stat.start))
    return found


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "sig, workers, ignored",
    [(signal.SIGINT, "2", True), (signal.SIGTERM, "0", False)],
    ids=["ctrl-c-to-a-parallel-session-started-with-sigint-ignored", "sigterm-to-a-serial-one"],
)
def test_an_interrupted_session_stops_and_leaves_nothing_running(tmp_path, sig, workers, ignored):
    pytest.importorskip("xdist")  # the test extras have it
    run = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "CCSUP_TEST_"))}
    env.update({MARKER: run, "CCSUP_READY_DIR": str(tmp_path)})

    def as_a_script_background_job() -> None:  # a shell without job control does this
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)

    session = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", workers]
        + ["tests/helpers/interrupted_session.py"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=as_a_script_background_job,
    )
    try:
        running = 1 if workers == "0" else 2  # serial: the first test waits, the second never runs
        wait_until(
            lambda: len(list(tmp_path.iterdir())) == running or session.poll() is not None,
            120,
            0.1,
            "each running test to have its turn running",
        )
        assert session.poll() is None, session.stdout.read().decode()
        assert len(_marked(run)) >= 4 * running  # supervisors, their zygotes, guards and sleeps
        session.send_signal(sig)
        out = session.communicate(timeout=60)[0].decode()
        assert session.returncode == 2, out  # pytest's "interrupted"
        assert "KeyboardInterrupt" in out, out
        assert _marked(run) == [], out
    finally:
        if session.poll() is None:
            session.kill()
            session.wait()
        for ident in _marked(run):
            procs.signal_process(ident, signal.SIGKILL)
