"""Shared test plumbing: a marker that every process a test starts inherits, and a check that none
is left running when the test ends (a leftover is a containment bug; it is killed by pid and the
test fails)."""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from guardd import procs

ROOT = Path(__file__).resolve().parent.parent
MARKER = "CCSUP_TEST_RUN"
os.environ.setdefault(MARKER, uuid.uuid4().hex)
# Every child of this pytest carries the marker; a parallel pytest run has its own.
RUN_ID = os.environ[MARKER]
PYTHON = sys.executable


def leftovers() -> list[procs.Identity]:
    """Processes started under this test run that are still running (zombies do not count)."""
    me = os.getpid()
    found = []
    for ident in procs.processes_with_env(MARKER, RUN_ID):
        if ident.pid == me:
            continue
        found.append(ident)
    return found


def _ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        stat = procs.read_stat(pid)
        if stat is None:
            break
        pid = stat.ppid
    return pids


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.01, what: str = "condition"):
    """Poll predicate until truthy; returns its value or fails the test naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


@pytest.fixture(autouse=True)
def no_process_left():
    """After each test, everything the test started must be gone (2 s allowed); else kill and fail."""
    yield
    ancestors = _ancestors()
    deadline = time.monotonic() + 2.0
    while True:
        left = [i for i in leftovers() if i.pid not in ancestors]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    if left:
        described = []
        for ident in left:
            try:
                cmd = Path(f"/proc/{ident.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                cmd = "?"
            described.append(f"{ident.pid} {cmd.strip()}")
            procs.signal_process(ident, signal.SIGCONT)
            procs.signal_process(ident, signal.SIGKILL)
        pytest.fail("processes left running (killed now): " + "; ".join(described))


@pytest.fixture
def state_dir():
    """A short private state directory (ipc:// paths must stay under 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="ccsup-t-", dir="/tmp"))
    os.chmod(path, 0o700)
    yield path
    import shutil

    shutil.rmtree(path, ignore_errors=True)
