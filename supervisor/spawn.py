"""Starting a turn's guard and following it: its pipes, its stdin, its pidfd.

The guard is started with the real interpreter (`sys.executable -I -S -c <bootstrap>`, see
guardd.launch: a `python3` shim on PATH can cost 90 ms a start, `site` another 11-23 ms, and -I
keeps a `guardd.py` in the turn's cwd from shadowing ours),
in a session of its own so nothing of the supervisor's terminal reaches it. Its stdout and stderr
are pipes the event loop reads: every chunk is appended to `<state>/turns/<id>/<stream>.log`
(the exact bytes) and handed on with its byte offset. The guard's exit is seen through a pidfd;
`reap()` is the daemon's only waitpid, called when that pidfd is readable.

State: the logs are append-only and survive restarts; a turn id is never run twice, so a log is
never mixed. Nothing here is persisted otherwise: a restarted supervisor finds guards by records.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from pathlib import Path
from typing import Callable

from guardd import procs
from guardd.launch import guard_command

OutputCallback = Callable[[str, int, bytes], None]  # stream, offset, data


class Guard:
    """One running guard process, as its parent sees it."""

    def __init__(self, turn_id: str, popen: subprocess.Popen, record_dir: Path):
        self.turn_id = turn_id
        self.popen = popen
        stat = procs.read_stat(popen.pid)  # not reaped yet, so the pid is still this child's
        self.identity = procs.Identity(popen.pid, stat.start if stat else 0)
        self.record_path = record_dir / f"{popen.pid}-{self.identity.start}.json"
        self.pidfd = os.pidfd_open(popen.pid)
        self.returncode: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._logs: dict[str, object] = {}
        self._offsets = {"stdout": 0, "stderr": 0}
        self._on_output: OutputCallback | None = None
        self._stdin_buffer = bytearray()
        self._stdin_eof = False
        self.terminate_pending = False

    @property
    def pid(self) -> int:
        return self.popen.pid

    def attach(self, loop, log_dir: Path, on_output: OutputCallback, on_exit: Callable[[], None]) -> None:
        """Start following the guard's pipes and its exit on the event loop."""
        self._loop = loop
        self._on_output = on_output
        log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        for stream in ("stdout", "stderr"):
            pipe = getattr(self.popen, stream)
            os.set_blocking(pipe.fileno(), False)
            self._logs[stream] = open(log_dir / f"{stream}.log", "ab", buffering=0)
            loop.add_reader(pipe.fileno(), self._read, stream)
        os.set_blocking(self.popen.stdin.fileno(), False)
        loop.add_reader(self.pidfd, on_exit)

    def _read(self, stream: str) -> None:
        pipe = getattr(self.popen, stream)
        try:
            data = os.read(pipe.fileno(), 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._close_stream(stream)
            return
        offset = self._offsets[stream]
        self._offsets[stream] = offset + len(data)
        self._logs[stream].write(data)
        self._on_output(stream, offset, data)

    def drain(self) -> None:
        """Read what the pipes hold now, so output comes before the events that follow it."""
        for stream in ("stdout", "stderr"):
            pipe = getattr(self.popen, stream)
            while stream in self._logs and not pipe.closed:
                before = self._offsets[stream]
                self._read(stream)
                if self._offsets[stream] == before:
                    break

    def _close_stream(self, stream: str) -> None:
        pipe = getattr(self.popen, stream)
        if not pipe.closed:
            if self._loop is not None:
                self._loop.remove_reader(pipe.fileno())
            pipe.close()
        log = self._logs.pop(stream, None)
        if log is not None:
            log.close()

    def write_stdin(self, data: bytes, eof: bool = False) -> int:
        """Queue data for CMD's stdin (written as the pipe takes it); eof closes it after."""
        if self._stdin_eof or self.popen.stdin.closed:
            raise BrokenPipeError("the turn's stdin is closed")
        self._stdin_buffer += data
        self._stdin_eof = eof
        self._flush_stdin()
        return len(data)

    def _flush_stdin(self) -> None:
        stdin = self.popen.stdin
        if stdin.closed:
            return
        fd = stdin.fileno()
        try:
            while self._stdin_buffer:
                n = os.write(fd, self._stdin_buffer)
                del self._stdin_buffer[:n]
        except BlockingIOError:
            self._loop.add_writer(fd, self._on_stdin_writable)
            return
        except OSError:
            self._stdin_buffer.clear()
            self._stdin_eof = True
        if self._stdin_eof:
            self._close_stdin()

    def _on_stdin_writable(self) -> None:
        self._loop.remove_writer(self.popen.stdin.fileno())
        self._flush_stdin()

    def _close_stdin(self) -> None:
        stdin = self.popen.stdin
        if not stdin.closed:
            if self._loop is not None:
                self._loop.remove_writer(stdin.fileno())
            stdin.close()

    def terminate(self) -> bool:
        """Ask the guard to end the turn (it sends SIGTERM, waits its grace, then SIGKILL).

        Until the guard has written its record it may not have its handlers yet, and SIGTERM
        would kill it outright: then the request stays pending and `terminate_if_pending`
        (called on every tick) sends it once the record is there.
        """
        if not self.record_path.exists():
            self.terminate_pending = True
            return False
        self.terminate_pending = False
        return procs.signal_process(self.identity, signal.SIGTERM)

    def terminate_if_pending(self) -> None:
        if self.terminate_pending and self.returncode is None:
            self.terminate()

    def reap(self) -> int | None:
        """The daemon's one waitpid for this guard; returns its status once it has exited."""
        if self.returncode is None:
            self.returncode = self.popen.poll()
        return self.returncode

    def close(self) -> None:
        """After the guard is reaped: stop watching, read what is left, close everything."""
        if self._loop is not None:
            self._loop.remove_reader(self.pidfd)
        self.drain()
        for stream in ("stdout", "stderr"):
            self._close_stream(stream)
        self._close_stdin()
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1


def start_guard(
    turn_id: str,
    argv: list[str],
    *,
    cwd: str | None,
    env: dict,
    record_dir: Path,
    grace: float,
    scan: float,
    bus: str | None,
) -> Guard:
    """Start `ccsup-guard` (python -I -S, guardd.launch) for one turn.

    OSError when it cannot be started (bad cwd...)."""
    args = ["--record-dir", str(record_dir), "--grace", f"{grace}", "--scan", f"{scan}",
            "--turn", turn_id]
    if bus:
        args += ["--bus", bus]
    command = guard_command([*args, "--", *argv])  # python -I -S: see guardd.launch
    full_env = dict(os.environ)
    for name, value in env.items():
        if value is None:
            full_env.pop(name, None)
        else:
            full_env[name] = value
    popen = subprocess.Popen(
        command,
        cwd=cwd,
        env=full_env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        close_fds=True,
    )
    return Guard(turn_id, popen, record_dir)
