"""Starting a turn's guard and following it: its pipes, its stdin, its exit.

A guard is started one of two ways, with the same arguments and the same result: through the guard
zygote (guardd.zygote), a warm process that forks a guard per turn in ~1-3 ms, while it runs; else
directly (`start_guard` here), as `sys.executable -I -S -c <bootstrap>` (guardd.launch: a `python3`
shim on PATH can cost 90 ms a start, `site` another 11-23 ms, and -I keeps a `guardd.py` in the
turn's cwd from shadowing ours), ~25-36 ms of CPU a turn. supervisor.guards.launcher chooses; containment
never depends on the zygote. Either way the guard is in a session of its own, so nothing of the
supervisor's terminal reaches it, and its stdout and stderr are pipes the event loop reads: every
read is appended to `<state>/turns/<id>/<stream>.log` (the exact bytes) and handed on as a
`supervisor.output.chunks.Chunk`: whole characters, its byte offset in the stream, chunks tiling it.
Beside each log, `<stream>.idx` records when each read arrived (`output.line_times`: 16 bytes a read, the
log's bytes untouched), for `ccsup logs -t`; it is made at its stream's first read, so a silent
stream has none (read as no times), and a turn's start creates two files fewer. With `log_limit`
([logs] turn_max_bytes), the two logs of a turn together stop growing at that many bytes:
`on_truncated` is called once (the daemon publishes `turn.<id>.truncated`), and the bus keeps
streaming, offsets still counting the stream. The guard's exit is seen through a pidfd. Its status:
a directly started guard is our child and `reap()` is the daemon's only waitpid for it, called when
that pidfd is readable; a forked guard is the zygote's child, reaped there, and its status comes
over the zygote's socket (`ForkedGuardProcess`): the exit callback waits for both. If the zygote
dies first, the status is lost, and the manager learns the outcome from the guard's record (or
calls the guard lost). A guard whose strays come to the supervisor (started directly, or its
zygote is gone) has an `exit_gate` (supervisor.guards.strays): its exit is handed on only once
they are gone.

A "pipe" turn's stdin is a pipe whose writer is ours (`write_stdin`, written as the pipe takes it;
its eof closes it). A guard started with adopt_within (GuardSpec.holds_stdin) holds another writer
of it (guardd.stdin), so that CMD reads no EOF when we die: our deliberate EOF then tells the guard
first (guardd.channel's close_stdin), then closes ours. A supervisor that adopts the guard is
handed a writer of its own in the answer, and gives it to the turn's GuardProcess (`take_stdin`).
A "tty" turn's stdin is a pty's master we only write and size (`resize`); the guard holds and
reads another (guardd.pty), and hands one to a supervisor that adopts it, the same way.

State: the logs are append-only and survive restarts; a turn id is never run twice, so a log is
never mixed. Nothing here is persisted otherwise: a restarted supervisor finds guards by records
and starts a zygote of its own. Bytes queued for a stdin that the pipe had not taken yet
(`stdin_pending`) are ours alone, and die with us.

Size: past 600 lines and still one concept, a guard as the supervisor holds it (its start pipe,
output pipes, stdin or pty, pidfd and exit), for the guard it started and the one it adopted,
which share every step but the first.
"""

from __future__ import annotations

import asyncio
import logging
import os
import select
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from guardd import channel, procs
from guardd.exits import EXIT_GUARD_FAILURE
from guardd.launch import guard_command
from guardd.record import record_path

from ..output import line_times
from ..output.chunks import Chunk, StreamSplitter
from ..output.follow import LogFollower

log = logging.getLogger("ccsup.spawn")

STREAMS = ("stdout", "stderr")
# A turn's log directory holds, for each stream, its bytes (.log), made before the turn starts,
# and their arrival times (.idx), made at the stream's first read.
LOG_FILES = tuple(f"{stream}.log" for stream in STREAMS)
OutputCallback = Callable[[str, Chunk], None]  # stream, chunk
TruncatedCallback = Callable[[str, str, int, int], None]  # turn id, stream, offset, limit
# A forked guard whose zygote died before reporting its status: unknown, read as the guard's own
# failure (the record's exit, when it has one, wins; without one the guard was lost).
STATUS_UNKNOWN = EXIT_GUARD_FAILURE
_STDIN_RETRY = 0.05  # seconds: a close_stdin the guard's full backlog refused is tried again
# Reads of 64 KiB a stream a hand-over publishes at most before it lets go (the rest is the
# adopter's: it goes on from the offsets saved), so a turn writing fast cannot hold it.
HANDOVER_READS = 16


class _Pipes:
    """What a GuardProcess needs of its process besides the status: pid and the three pipe ends."""

    def __init__(self, pid: int, stdin: int, stdout: int, stderr: int):
        self.pid = pid
        self.stdio = (stdin, stdout, stderr)

    def poll(self) -> int | None:
        """Unknown here: the zygote reaps a forked guard and reports its status."""
        return None


def _nothing(*args: object) -> None:
    """The callbacks of a guard not yet attached to the event loop."""


def _open_append(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)


class GuardProcess:
    """One running guard process, as the supervisor sees it (started directly: our child).

    Its pipes and logs are plain descriptors, each closed once (then dropped, or -1 for stdin):
    a file object for each of the seven cost ~270 bytes a turn apiece."""

    def __init__(
        self,
        turn_id: str,
        process: subprocess.Popen[bytes] | _Pipes,
        record_dir: Path,
        *,
        stdio: tuple[int, int, int],
        pidfd: int | None = None,
        start: int | None = None,
        ready: int = -1,
    ):
        """process: a subprocess.Popen (or, for ForkedGuardProcess, a forked guard's _Pipes);
        stdio: our ends of its stdin, stdout and stderr pipes, ours to close from now on; -1 for
        stdout and stderr: the guard writes the logs itself (guardd.output), which are followed.
        ready: the reader of its start pipe (open_stdio), ours to close; -1: none."""
        self.turn_id = turn_id
        self._ready = ready
        self._on_ready: Callable[[], None] | None = None
        self.popen = process
        self._stdin = stdio[0]
        self._pipes = {"stdout": stdio[1], "stderr": stdio[2]}
        if start is None:
            stat = procs.read_stat(process.pid)  # not reaped yet, so the pid is still this child's
            start = stat.start if stat else 0
        self.identity = procs.Identity(process.pid, start)
        self.record_path = record_path(record_dir, self.identity)
        self.pidfd = os.pidfd_open(process.pid) if pidfd is None else pidfd
        self.returncode: int | None = None
        self._on_exit: Callable[[], None] = _nothing
        self._loop: asyncio.AbstractEventLoop | None = None
        self._logs: dict[str, int] = {}
        self._indexes: dict[str, int] = {}  # made at the stream's first read (-1: could not be)
        self._log_dir = Path()
        self.log_limit: int | None = None  # [logs] turn_max_bytes: both logs together
        self.on_truncated: TruncatedCallback | None = None
        self._logged = 0
        self.truncated = False
        self._offsets = {"stdout": 0, "stderr": 0}  # bytes read from each pipe (or log)
        self._followers: dict[str, LogFollower] = {}  # the logs the guard writes itself
        self._splitters: dict[str, StreamSplitter] = {}  # made at a stream's first read
        self._on_output: OutputCallback = _nothing
        self._stdin_buffer = bytearray()
        self._stdin_eof = False
        # The guard holds a writer of CMD's stdin too (started with adopt_within, stdin "pipe";
        # guardd.stdin): a deliberate EOF is then told to it over its channel (close_stdin), or
        # CMD would never read it.
        self.stdin_held = False
        self.terminate_pending = False
        # Set when its strays come to the supervisor (supervisor.guards.strays): its exit goes
        # through it, held there until they are gone. Called once, with (pid, on_exit).
        self.exit_gate: Callable[[int, Callable[[], None]], None] | None = None
        self.grace = 5.0  # its --grace (GuardSpec.grace), what its strays get before SIGKILL

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop it was attached to (a bug to ask before `attach`)."""
        assert self._loop is not None, "the guard is not attached to an event loop"
        return self._loop

    def attach(
        self,
        loop: asyncio.AbstractEventLoop,
        log_dir: Path,
        on_output: OutputCallback,
        on_exit: Callable[[], None],
    ) -> None:
        """Start following the guard's pipes and its exit on the event loop. log_dir exists (the
        start made it before the guard, supervisor.turns.starting); its logs are opened, or made if the
        file thread has not made them yet."""
        self._loop = loop
        self._on_output = on_output
        for stream in STREAMS:
            pipe = self._pipes[stream]
            if pipe < 0:  # the guard writes this log: follow it from where we are
                del self._pipes[stream]
                self._followers[stream] = LogFollower(
                    loop,
                    str(log_dir / f"{stream}.log"),
                    partial(self._followed, stream),
                    self._offsets[stream],
                )
                continue
            os.set_blocking(pipe, False)
            self._logs[stream] = _open_append(log_dir / f"{stream}.log")
            loop.add_reader(pipe, self._read, stream)
        self._log_dir = log_dir
        if self._stdin >= 0:  # -1: its stdin is /dev/null
            os.set_blocking(self._stdin, False)
        self._on_exit = on_exit
        loop.add_reader(self.pidfd, self._on_pidfd)

    def when_ready(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
        """Call back once the guard has started CMD and written its record (so a supervisor that
        dies from then on leaves a turn that can be adopted), or has failed to start it: the
        guard closes its start pipe then (guardd.guard), and it closes when the guard exits.
        At once for a guard without one (one that writes no logs)."""
        if self._ready < 0:
            callback()
            return
        self._on_ready = callback
        os.set_blocking(self._ready, False)
        loop.add_reader(self._ready, self._ready_now, loop)

    def _ready_now(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        try:
            if os.read(self._ready, 64):
                return  # nothing is written into it: only its end counts
        except BlockingIOError:
            return
        except OSError:
            pass
        self._close_ready(loop)
        callback, self._on_ready = self._on_ready, None
        if callback is not None:
            callback()

    def _close_ready(self, loop: asyncio.AbstractEventLoop | None) -> None:
        if self._ready >= 0:
            if loop is not None:
                loop.remove_reader(self._ready)
            os.close(self._ready)
            self._ready = -1

    def _on_pidfd(self) -> None:
        """The guard has exited (its pidfd is readable)."""
        self._exited_now()

    def _exited_now(self) -> None:
        """Hand the exit on, through the exit gate when there is one. Reaped first: out of the
        gate's guards, a zombie child of ours that is no Popen's would be reaped there. Its start
        pipe is at its end too, and its readiness comes first (a turn is started before it ends),
        whichever of the two the loop saw first."""
        if self._on_ready is not None:
            self._close_ready(self._loop)
            callback, self._on_ready = self._on_ready, None
            callback()
        gate, self.exit_gate = self.exit_gate, None
        if gate is None:
            self._on_exit()
            return
        if self._loop is not None and self.pidfd >= 0:
            self._loop.remove_reader(self.pidfd)  # level-triggered: it would fire while held
        self.reap()
        gate(self.pid, self._on_exit)

    def _read(self, stream: str) -> None:
        try:
            data = os.read(self._pipes[stream], 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._close_stream(stream)
            return
        self._log(stream, self._offsets[stream], data)
        self._offsets[stream] += len(data)
        splitter = self._splitters.get(stream)
        if splitter is None:
            splitter = self._splitters[stream] = StreamSplitter()
        chunk = splitter.feed(data)
        if chunk is not None:
            self._on_output(stream, chunk)

    def _followed(self, stream: str, offset: int, data: bytes) -> None:
        """A read of a log the guard writes (supervisor.output.follow): hand it on."""
        self._offsets[stream] = offset + len(data)
        splitter = self._splitters.get(stream)
        if splitter is None:
            splitter = self._splitters[stream] = StreamSplitter(offset)
        chunk = splitter.feed(data)
        if chunk is not None:
            self._on_output(stream, chunk)
        if self.log_limit is not None and not self.truncated:
            if sum(self._offsets.values()) >= self.log_limit:  # the guard stops both logs there
                self.truncated = True
                if self.on_truncated is not None:
                    end = offset + len(data)
                    self.on_truncated(self.turn_id, stream, end, self.log_limit)

    def _finish(self, stream: str) -> None:
        """Send what the stream's splitter holds back (an incomplete character, for good)."""
        splitter = self._splitters.get(stream)
        chunk = splitter.finish() if splitter is not None else None
        if chunk is not None:
            self._on_output(stream, chunk)

    def drain(self) -> None:
        """Read what the pipes hold now, so output comes before the events that follow it.

        Called when CMD's outcome is known: a character still incomplete then is sent as it is
        (bytes, `data_b64`), since the turn's end may be published before the pipes close (its
        work confirmed gone while the guard itself still holds them). Bytes that complete it
        later (a descendant's) follow as a chunk of their own; offsets still tile the stream.
        """
        for stream in STREAMS:
            follower = self._followers.get(stream)
            if follower is not None:
                follower.read()  # the guard logged CMD's last bytes before recording its exit
            while stream in self._logs and stream in self._pipes:
                before = self._offsets[stream]
                self._read(stream)
                if self._offsets[stream] == before:
                    break
            self._finish(stream)

    def published(self, stream: str) -> int:
        """The stream's offset after the last byte handed on (a held-back incomplete character
        not counted: it is handed on with the bytes that complete it)."""
        splitter = self._splitters.get(stream)
        return splitter.offset if splitter is not None else self._offsets[stream]

    def hand_over(self) -> dict[str, int]:
        """At a hand-over (`ccsup restart`): hand on what the logs hold now (up to HANDOVER_READS
        reads a stream), then let go of the guard untouched: nothing more is read, handed on or
        called back (its exit included), and no descriptor it needs is closed. Returns each
        stream's offset published so far: where the adopting supervisor goes on."""
        for follower in self._followers.values():
            follower.read(HANDOVER_READS)
        offsets = {stream: self.published(stream) for stream in STREAMS}
        self._on_output = _nothing
        self._on_exit = _nothing
        for follower in self._followers.values():
            follower.close()
        self._followers.clear()
        if self._loop is not None:
            self._loop.remove_reader(self.pidfd)
            for pipe in self._pipes.values():  # a guard that writes no logs: read by us until now
                self._loop.remove_reader(pipe)
            if self._stdin >= 0:
                self._loop.remove_writer(self._stdin)
        return offsets

    def _log(self, stream: str, offset: int, data: bytes) -> None:
        """Append a read to its log (and its arrival to the index), up to the turn's log limit."""
        if self.truncated:
            return
        room = len(data) if self.log_limit is None else self.log_limit - self._logged
        piece = data if room >= len(data) else data[: max(room, 0)]
        if piece:
            index = self._indexes.get(stream)
            if index is None:
                index = self._indexes[stream] = self._open_index(stream)
            if index >= 0:
                os.write(index, line_times.entry(offset, time.time()))
            os.write(self._logs[stream], piece)
            self._logged += len(piece)
        if len(piece) < len(data):
            self.truncated = True
            if self.on_truncated is not None:
                self.on_truncated(self.turn_id, stream, offset + len(piece), self.log_limit or 0)

    def _open_index(self, stream: str) -> int:
        """The stream's index, made now; -1 when it cannot be (its log is what must not fail)."""
        path = self._log_dir / f"{stream}.idx"
        try:
            return _open_append(path)
        except OSError as e:
            log.warning("unable to make %s, its log goes on without times: %s", path, e.strerror)
            return -1

    def _close_stream(self, stream: str) -> None:
        pipe = self._pipes.pop(stream, None)
        if pipe is not None:
            if self._loop is not None:
                self._loop.remove_reader(pipe)
            os.close(pipe)
        index = self._indexes.pop(stream, None)
        if index is not None and index >= 0:
            os.close(index)
        log = self._logs.pop(stream, None)
        if log is not None:
            os.close(log)
            self._finish(stream)

    @property
    def stdin_pending(self) -> int:
        """Bytes sent to CMD's stdin that the pipe has not taken yet (a writer's back-pressure)."""
        return len(self._stdin_buffer)

    def write_stdin(self, data: bytes, eof: bool = False) -> int:
        """Queue data for CMD's stdin (written as the pipe takes it); eof closes it after."""
        if self._stdin_eof or self._stdin < 0:
            raise BrokenPipeError("the turn's stdin is closed")
        self._stdin_buffer += data
        self._stdin_eof = eof
        self._flush_stdin()
        return len(data)

    def _flush_stdin(self) -> None:
        fd = self._stdin
        if fd < 0:
            return
        try:
            while self._stdin_buffer:
                n = os.write(fd, self._stdin_buffer)
                del self._stdin_buffer[:n]
        except BlockingIOError:
            self.loop.add_writer(fd, self._on_stdin_writable)
            return
        except OSError:  # CMD's end is closed: nobody reads it any more
            self._stdin_buffer.clear()
            self._stdin_eof = True
            self._close_stdin()
            return
        if self._stdin_eof:
            self._end_stdin()

    def _end_stdin(self) -> None:
        """The deliberate EOF: the guard's writer first (if it holds one), then ours, so that a
        supervisor dying in between leaves no writer either."""
        if self.stdin_held:
            try:
                channel.close_stdin(channel.channel_file(str(self.record_path)))
            except (BlockingIOError, FileNotFoundError, ConnectionRefusedError):
                # Its backlog is full, or its channel is not there yet (a guard just started: it
                # makes it before it holds the writer, and reads the op after): again shortly,
                # ours kept open till then, while the guard runs (a gone one took its writer).
                if self._guard_runs():
                    self.loop.call_later(_STDIN_RETRY, self._end_stdin)
                    return
            except OSError as e:
                log.warning("turn %s: unable to close its guard's stdin: %s", self.turn_id, e)
            self.stdin_held = False
        self._close_stdin()

    def _guard_runs(self) -> bool:
        """Its pidfd is open and not readable yet (a pidfd reads ready once its process ended)."""
        return self.pidfd >= 0 and not select.select([self.pidfd], [], [], 0)[0]

    def take_stdin(self, fd: int | None) -> None:
        """After adoption: the turn's stdin is `fd` from now on (guardd.channel.adopt's
        `stdin_fd`, ours to close), a writer of the pipe the guard holds another of (a "tty"
        turn's: a master of its pty, written and sized, never read here); None: the
        turn has no stdin left (closed deliberately before, or the guard held none), so a `send`
        is refused. What was queued for the stdin before is dropped (it went with whoever held
        it)."""
        self._close_stdin()
        self._stdin_buffer.clear()
        self._stdin_eof = fd is None
        self.stdin_held = fd is not None
        if fd is not None:
            os.set_blocking(fd, False)
            self._stdin = fd

    def resize(self, rows: int, cols: int) -> None:
        """Size the turn's terminal (a "tty" turn: our stdin is the pty's master); OSError
        (ENOTTY) for a turn whose stdin is a pipe, EBADF once it is closed."""
        if self._stdin < 0:
            raise OSError(9, "the turn's stdin is closed")
        set_winsize(self._stdin, rows, cols)

    def _on_stdin_writable(self) -> None:
        self.loop.remove_writer(self._stdin)
        self._flush_stdin()

    def _close_stdin(self) -> None:
        fd, self._stdin = self._stdin, -1
        if fd >= 0:
            if self._loop is not None:
                self._loop.remove_writer(fd)
            os.close(fd)

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
        if self.pidfd < 0:
            return procs.signal_process(self.identity, signal.SIGTERM)
        try:  # the pidfd is this very process: no identity check (a /proc read) needed
            signal.pidfd_send_signal(self.pidfd, signal.SIGTERM)
        except ProcessLookupError:
            return False
        return True

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
        for stream in STREAMS:
            self._close_stream(stream)
        for follower in self._followers.values():
            follower.close()
        self._followers.clear()
        self._close_stdin()
        self._on_ready = None
        self._close_ready(self._loop)
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1


def _seconds(value: float) -> str:
    """Seconds as the duration grammar reads them: positional, never an exponent (1e-05)."""
    from decimal import Decimal

    return format(Decimal(repr(value)), "f")


@dataclass(frozen=True)
class GuardSpec:
    """What one turn's guard is started with, however it starts (directly, or forked by the
    zygote): its command, where it runs, and how it guards it. The starter builds it once; the
    launcher, the direct start and the cluster's wrapper pass it through."""

    turn_id: str
    argv: list[str]
    cwd: str | None
    env: dict[str, str | None]  # the turn's additions to the supervisor's environment
    record_dir: Path
    grace: float
    scan: float
    bus: str | None
    cgroup: str | None = None
    stdin: str = "pipe"  # the turn's stdin mode (open_stdio)
    winsize: tuple[int, int] | None = None  # a "tty" turn's terminal at its start: rows, cols
    log_dir: Path | None = None  # the turn's logs, written by the guard
    log_limit: int | None = None  # [logs] turn_max_bytes, both logs together
    adopt_within: float = 0.0  # [guard] adopt_within: how long the guard outlives us (guardd)

    @property
    def holds_stdin(self) -> bool:
        """The guard holds a writer of the turn's stdin pipe (guardd.stdin): a deliberate EOF
        goes to it too (GuardProcess.stdin_held)."""
        return self.adopt_within > 0 and self.stdin == "pipe"

    @property
    def guard_logs(self) -> bool:
        """The guard writes the logs (guardd.output); a "tty" turn's from the pty's master it
        holds (guardd.pty)."""
        return self.log_dir is not None


def guard_args(spec: GuardSpec) -> list[str]:
    """`ccsup-guard` arguments for one turn."""
    args = [
        "--record-dir",
        str(spec.record_dir),
        "--grace",
        _seconds(spec.grace),
        "--scan",
        _seconds(spec.scan),
        "--turn",
        spec.turn_id,
    ]
    if spec.bus:
        args += ["--bus", spec.bus]
    if spec.cgroup:
        args += ["--cgroup", spec.cgroup]
    if spec.stdin == "tty":
        args.append("--tty")
    if spec.adopt_within > 0 and spec.guard_logs:  # adoption needs the logs the guard keeps
        args += ["--adopt-within", _seconds(spec.adopt_within)]
    if spec.guard_logs:
        args += ["--log-dir", str(spec.log_dir)]
        if spec.log_limit is not None:
            args += ["--log-limit", str(spec.log_limit)]
    return [*args, "--", *spec.argv]


def open_stdio(
    stdin: str, winsize: tuple[int, int] | None = None, guard_logs: bool = False
) -> tuple[tuple, tuple, int]:
    """The guard's stdin, stdout and stderr, and ours (its stdin's writer, the readers of its
    stdout and stderr), by the turn's stdin mode (supervisor.wire.args.STDIN_MODES):
    - "pipe": three pipes;
    - "null": its stdin /dev/null, ours -1 (a `send` is refused: the stdin is closed);
    - "tty": a pty (sized `winsize`, rows and cols): its three are the slave, our stdin and
      stdout the master (the pty's bytes, exactly as it gives them, are the stdout log) and our
      stderr a pipe already at its end (the pty merges the streams).
    guard_logs: the guard writes the logs itself (guardd.output) and puts its own pipes on its
    fds 1 and 2: its stdout until then is the writer of its start pipe, whose reader is the third
    value returned (else -1), its stderr /dev/null, ours -1 (see GuardProcess.when_ready). With
    "tty" its stdin is the slave and its stderr a master, which it holds and reads (guardd.pty);
    ours is a master we only write (the turn's input) and size, never read. Every descriptor is
    close-on-exec; each is ours to close once."""
    if stdin == "tty":
        master, slave = os.openpty()  # glibc opens the slave O_NOCTTY: never our terminal
        try:
            if winsize is not None:
                set_winsize(master, *winsize)
            if guard_logs:
                ready_r, ready_w = os.pipe()
                return (slave, ready_w, os.dup(master)), (master, -1, -1), ready_r
            stderr_r, stderr_w = os.pipe()
            os.close(stderr_w)
            return (slave, os.dup(slave), os.dup(slave)), (os.dup(master), master, stderr_r), -1
        except BaseException:
            os.close(master)
            os.close(slave)
            raise
    if stdin == "null":
        stdin_r, stdin_w = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC), -1
    else:
        stdin_r, stdin_w = os.pipe()
    if guard_logs:
        null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        ready_r, ready_w = os.pipe()
        return (stdin_r, ready_w, null), (stdin_w, -1, -1), ready_r
    stdout_r, stdout_w = os.pipe()
    stderr_r, stderr_w = os.pipe()
    return (stdin_r, stdout_w, stderr_w), (stdin_w, stdout_r, stderr_r), -1


def close_all(fds) -> None:
    for fd in fds:
        if fd >= 0:
            os.close(fd)


def set_winsize(fd: int, rows: int, cols: int) -> None:
    """Size the terminal on fd (TIOCSWINSZ; its foreground group gets SIGWINCH)."""
    import fcntl
    import struct
    import termios

    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def guard_env(env: dict[str, str | None]) -> dict[str, str]:
    """The supervisor's environment with the turn's added (a None value removes a variable)."""
    full_env = dict(os.environ)
    for name, value in env.items():
        if value is None:
            full_env.pop(name, None)
        else:
            full_env[name] = value
    return full_env


def start_guard(spec: GuardSpec) -> GuardProcess:
    """Start `ccsup-guard` (python -I -S, guardd.launch) for one turn, as our child.

    OSError when it cannot be started (bad cwd...)."""
    theirs, ours, ready = open_stdio(spec.stdin, spec.winsize, spec.guard_logs)
    (stdin_r, stdout_w, stderr_w), (stdin_w, stdout_r, stderr_r) = theirs, ours
    try:
        popen = subprocess.Popen(
            guard_command(guard_args(spec)),  # python -I -S: see guardd.launch
            cwd=spec.cwd,
            env=guard_env(spec.env),
            stdin=stdin_r,
            stdout=stdout_w,
            stderr=stderr_w,
            start_new_session=True,
            close_fds=True,
        )
    except BaseException:
        close_all((stdin_w, stdout_r, stderr_r, ready))
        raise
    finally:
        for fd in (stdin_r, stdout_w, stderr_w):  # the guard's ends: it has its own copies
            os.close(fd)
    guard = GuardProcess(
        spec.turn_id, popen, spec.record_dir, stdio=(stdin_w, stdout_r, stderr_r), ready=ready
    )
    guard.stdin_held = spec.holds_stdin
    return guard


class ForkedGuardProcess(GuardProcess):
    """A guard the zygote forked: the zygote reaps it and reports its status over its socket.

    Its pidfd may turn readable before the report comes: the exit callback then waits for the
    report (`status_reported`), or, once the zygote is known gone, goes without (STATUS_UNKNOWN).
    """

    def __init__(
        self,
        turn_id: str,
        pipes: _Pipes,
        record_dir: Path,
        *,
        pidfd: int,
        start: int,
        ready: int = -1,
    ):
        super().__init__(
            turn_id, pipes, record_dir, stdio=pipes.stdio, pidfd=pidfd, start=start, ready=ready
        )
        self.reported: int | None = None
        self.orphaned = False  # its zygote is gone: no status will come
        self._exited = False

    def _on_pidfd(self) -> None:
        self._exited = True
        if self.reap() is None:
            self.loop.remove_reader(self.pidfd)  # level-triggered: wait for the report instead
            return
        self._exited_now()

    def reap(self) -> int | None:
        if self.returncode is None:
            if self.reported is not None:
                self.returncode = self.reported
            elif self.orphaned and self._exited:
                self.returncode = STATUS_UNKNOWN
        return self.returncode

    def status_reported(self, returncode: int | None) -> None:
        """From the launcher: the zygote reaped it (returncode), or the zygote is gone (None)."""
        if returncode is None:
            self.orphaned = True
        else:
            self.reported = returncode
        if self._exited and self.pidfd >= 0 and self.reap() is not None:
            self._exited_now()


class AdoptedGuardProcess(GuardProcess):
    """A guard that a supervisor which died (or handed over) left running, adopted over its
    channel (supervisor.turns.adopt). Not our child, nor our zygote's: its exit status is unknown
    (STATUS_UNKNOWN), and the record's exit, written before the guard ends, is what counts. Its
    logs are followed from `offsets` (a margin before the gap: bytes published twice have the
    same offsets and contents)."""

    def __init__(
        self,
        turn_id: str,
        identity: procs.Identity,
        record_dir: Path,
        *,
        pidfd: int,
        offsets: dict[str, int],
        stdin: int = -1,
    ):
        pipes = _Pipes(identity.pid, -1, -1, -1)
        super().__init__(
            turn_id, pipes, record_dir, stdio=pipes.stdio, pidfd=pidfd, start=identity.start
        )
        self.take_stdin(stdin if stdin >= 0 else None)
        for stream in STREAMS:
            self._offsets[stream] = offsets.get(stream, 0)
        self._exited = False

    def _on_pidfd(self) -> None:
        self._exited = True
        self._on_exit()

    def reap(self) -> int | None:
        if self.returncode is None and self._exited:
            self.returncode = STATUS_UNKNOWN
        return self.returncode
