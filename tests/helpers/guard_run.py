"""A guard under test (`python -m guardd`), read line by line: the harness of the guard's tests.

Each CMD (tests/helpers/guard_cmds.py) announces every process it starts (`<role> <pid> <start>
<pgid>`) on the guard's stdout; a test acts only after reading those lines, never after a sleep.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from guardd import procs, record

PYTHON = sys.executable
HELPERS = Path(__file__).resolve().parent
CMDS = str(HELPERS / "guard_cmds.py")
GRACE = 0.4


class GuardRun:
    """A guard under test: its Popen, a line reader over its stdout, its record directory."""

    def __init__(
        self,
        tmp_path: Path,
        cmd: list[str],
        *opts: str,
        grace=GRACE,
        scan="0.1",
        env=None,
        launcher: list[str] | None = None,
        stdin=None,
    ):
        self.record_dir = tmp_path / "guards"
        argv = [
            PYTHON,
            "-m",
            "guardd",
            "--record-dir",
            str(self.record_dir),
            "--grace",
            str(grace),
            "--scan",
            str(scan),
            *opts,
            "--",
            *cmd,
        ]
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            (launcher or []) + argv, stdout=subprocess.PIPE, env=env, stdin=stdin
        )
        self.ident = None
        self.seen: list[procs.Identity] = []  # every process the CMD announced
        self._buf = b""

    def line(self, timeout: float = 10.0) -> list[str]:
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                pytest.fail(f"no line from the guard's CMD within {timeout}s")
            chunk = os.read(fd, 65536)
            if not chunk:
                pytest.fail(f"the guard's stdout closed; got {self._buf!r}")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode().split()

    def announced(self, role: str) -> tuple[procs.Identity, int]:
        words = self.line()
        assert words[0] == role, words
        ident = procs.Identity(int(words[1]), int(words[2]))
        self.seen.append(ident)
        return ident, int(words[3])

    def wait(self, timeout: float = 15.0) -> int:
        rc = self.proc.wait(timeout)
        self.elapsed = time.monotonic() - self.started
        self.proc.stdout.close()
        return rc

    def close(self) -> None:
        """After a failed test: the guard SIGKILLed and reaped, then every process its CMD
        announced (a guard killed outright leaves its setsid children), by pid and start."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        for ident in self.seen:
            procs.signal_process(ident, signal.SIGKILL)

    def record_path(self) -> Path:
        (path,) = self.record_dir.glob("*.json")
        return path

    def record(self) -> dict:
        return record.read_json(self.record_path())


def gone(ident: procs.Identity) -> bool:
    return not procs.process_running(ident)


def py(action: str, *args: str) -> list[str]:
    return [PYTHON, CMDS, action, *args]
