"""The guard zygote: one warm process per supervisor that forks a guard for each turn.

Design note. A guard started as a fresh interpreter costs ~25-36 ms of CPU (interpreter start and
imports), and at cap 4 on two cores that, not the work, set the pace. The zygote is started once
(`python -I -S -c ZYGOTE_BOOTSTRAP --fd N`, as guards are, see guardd.launch), imports guardd, and
then forks a guard per request (~1-3 ms); the forked child runs `guardd.__main__.main` directly,
with no exec of a new interpreter. It is single-threaded and imports only the standard library, so
a fork copies no lock held by another thread; the guard's hints thread starts after the fork, in
the child.

The wire: one AF_UNIX stream socketpair between the supervisor and its zygote. Each message is a
4-byte big-endian length and a `marshal`led tuple (exact for every str the environment can hold,
lone surrogates included; both ends are the same interpreter, and nobody else holds the socket):
  supervisor -> zygote   ("spawn", args, cwd, env) with the child's stdin, stdout and stderr fds
                         attached (SCM_RIGHTS);
  zygote -> supervisor   ("ready", pid) once, at start;
                         ("spawned", pid, start_ticks) with a pidfd on the child attached, or
                         ("failed", errno, operation) when the child could not be set up;
                         ("exited", pid, returncode) for each spawned child it reaps (Popen's
                         convention: -N for signal N).
Requests are answered one at a time, in order; the supervisor may send many before the first
answer (pipelined: it does not wait, and takes each answer on its event loop when it comes).

One spawn:
1. The zygote forks. The child puts the three fds on 0-2, closes every other fd but three (its
   report pipe, its go pipe, and the pidfd on the supervisor) so that no slot lock, socket or other
   turn's pipe leaks into a guard, calls setsid() (a session of its own, as start_new_session
   did), chdir(cwd), and reports an error, or success by closing its report pipe.
2. The zygote opens a pidfd on the child. The child is its own and not reaped yet, so the pid
   cannot have been reused: the pidfd and the start ticks it sends are the child's, race-free.
3. Only after that answer is sent does the zygote write "go" to the child, which then restores the
   signal mask a fresh interpreter has and runs the guard, then os._exit()s with its status (its
   environment and title are set while the zygote answers: nothing outside the child sees them).
   A child that reads EOF instead (the zygote died, or was killed by a supervisor that gave up
   waiting) exits 125 without running anything: a guard the supervisor does not know of can
   never run.

The guard's parent is the zygote, but "parent gone" must mean the supervisor: the child hands the
guard the zygote's pidfd on the supervisor to watch instead (`main(args, parent_fd=...)`). A
SIGKILLed supervisor thus ends every turn directly, as before; the zygote, watching the same pidfd
(and its socket's EOF), exits too. A zygote that dies leaves its guards running under their
supervisor's watch (they are reparented to init or a subreaper, which reaps them).

The zygote is the one reaper of its children (the supervisor cannot waitpid them), so it reports
each spawned child's status over the socket. If it dies first, that status is lost: the supervisor
then has the guard's record (its `exit`, written when CMD exited) and treats a guard with neither as
lost.

The supervisor's end of the socket is guardd.zygote_handle; this module is the wire and the zygote
process itself.

State: none on disk. The zygote lives as long as its supervisor and its socket; a supervisor that
starts again starts a new zygote. It has no configuration of its own: every request carries the
guard's arguments, cwd and whole environment.
"""

from __future__ import annotations

import array
import marshal
import os
import select
import signal
import socket
import struct
import sys

from guardd import linux, procs
from guardd.exits import EXIT_GUARD_FAILURE

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the guard's start pays)
if TYPE_CHECKING:
    from collections.abc import Sequence

_HEADER = struct.Struct(">I")
MAX_MESSAGE = 16 << 20  # a request larger than this goes the old way (the caller decides)
_MAX_FDS = 64  # ancillary room per read (a request carries 3, an answer 1; requests are pipelined)
_READ_SIZE = 1 << 16


def encode(message: tuple) -> bytes:
    body = marshal.dumps(message)
    if len(body) > MAX_MESSAGE:
        raise ValueError(
            f"a zygote message of {len(body)} bytes is over the {MAX_MESSAGE}-byte limit"
        )
    return _HEADER.pack(len(body)) + body


class Inbox:
    """Bytes and fds as they come off the stream, cut into messages."""

    def __init__(self):
        self.data = bytearray()
        self.fds: list[int] = []

    def receive(self, sock: socket.socket) -> bool:
        """One read; False at EOF. BlockingIOError when nothing is there (non-blocking socket)."""
        data, ancdata, flags, _ = sock.recvmsg(
            _READ_SIZE, socket.CMSG_SPACE(_MAX_FDS * 4), socket.MSG_CMSG_CLOEXEC
        )
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
                self.fds.extend(fds)
        if flags & socket.MSG_CTRUNC:
            raise OSError("unable to read from the zygote socket: file descriptors were truncated")
        self.data += data
        return bool(data)

    def messages(self):
        while len(self.data) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self.data)
            if size > MAX_MESSAGE:
                raise OSError(f"unable to read from the zygote socket: a {size}-byte message")
            if len(self.data) < _HEADER.size + size:
                return
            body = bytes(self.data[_HEADER.size : _HEADER.size + size])
            del self.data[: _HEADER.size + size]
            yield marshal.loads(body)

    def take_fds(self, n: int) -> list[int]:
        if len(self.fds) < n:
            raise OSError(
                f"unable to read from the zygote socket: {n} fds expected, {len(self.fds)} came"
            )
        taken, self.fds = self.fds[:n], self.fds[n:]
        return taken

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


def _send(sock: socket.socket, message: tuple, fds: Sequence[int] = ()) -> None:
    data = encode(message)
    sent = socket.send_fds(sock, [data], fds) if fds else sock.send(data)
    if sent < len(data):
        sock.sendall(data[sent:])


# -- the zygote process ----------------------------------------------------------------------------


def _ignore(signum, frame):
    """SIGCHLD only wakes the loop, through the wakeup fd."""


class _Zygote:
    def __init__(self, sock: socket.socket, parent_fd: int):
        self.sock = sock
        self.parent_fd = parent_fd
        self.inbox = Inbox()
        self.spawned: set[int] = set()  # children announced to the supervisor, not yet reaped
        # What a fresh interpreter has, so that each child gets it back (we change SIGCHLD only).
        self.chld_handler = signal.getsignal(signal.SIGCHLD)
        self.mask = signal.pthread_sigmask(signal.SIG_BLOCK, ())
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, _ignore)
        self.wake_w = wake_w

    def serve(self) -> int:
        _send(self.sock, ("ready", os.getpid()))
        poller = select.poll()
        for fd in (self.sock.fileno(), self.parent_fd, self.wake_r):
            poller.register(fd, select.POLLIN)
        while True:
            ready = {fd for fd, _ in poller.poll()}
            if self.parent_fd in ready:
                return 0  # the supervisor is gone: its guards watch it too and end their turns
            if self.wake_r in ready:
                _drain(self.wake_r)
                self._reap()
            if self.sock.fileno() in ready:
                if not self.inbox.receive(self.sock):
                    return 0  # the supervisor closed its end: it is stopping
                for message in self.inbox.messages():
                    if message[0] != "spawn":
                        raise OSError(
                            f"unable to serve the zygote socket: unknown request {message[0]!r}"
                        )
                    _, args, cwd, env = message
                    self._spawn(args, cwd, env, self.inbox.take_fds(3))

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self.spawned:  # a child that failed its set-up was never announced
                self.spawned.discard(pid)
                _send(self.sock, ("exited", pid, os.waitstatus_to_exitcode(status)))

    def _spawn(self, args: list[str], cwd: str | None, env: dict, stdio: list[int]) -> None:
        report_r, report_w = os.pipe()
        go_r, go_w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError as e:
            for fd in (report_r, report_w, go_r, go_w, *stdio):
                os.close(fd)
            _send(self.sock, ("failed", e.errno or 0, "fork"))
            return
        if pid == 0:
            self._child(args, cwd, env, stdio, report_w, go_r)  # never returns
        for fd in (report_w, go_r, *stdio):
            os.close(fd)
        failure = b""
        while chunk := os.read(report_r, 4096):
            failure += chunk
        os.close(report_r)
        if failure:
            os.close(go_w)
            errno_, operation = marshal.loads(failure)
            _send(self.sock, ("failed", errno_, operation))
            return  # the child exits 125 at once; _reap takes it without a word
        try:
            pidfd = os.pidfd_open(pid)  # our unreaped child: the pid is certainly still its own
            start = procs.start_ticks(pid)
            try:
                _send(self.sock, ("spawned", pid, start), [pidfd])
            finally:
                os.close(pidfd)
        except BaseException:
            os.close(go_w)  # no go: the child exits without running anything
            raise
        self.spawned.add(pid)
        os.write(go_w, b"g")
        os.close(go_w)

    def _child(self, args, cwd, env, stdio, report_w: int, go_r: int) -> None:
        """In the forked child: set up as a fresh guard would be, wait for go, run the guard.

        Never returns, whatever happens: a child that came back into the zygote's loop would
        serve the supervisor's socket as a second zygote."""
        code = EXIT_GUARD_FAILURE
        try:
            code = self._run_child(args, cwd, env, stdio, report_w, go_r)
        except SystemExit as e:  # as the interpreter would treat it (`--help` exits 0)
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:  # noqa: BLE001 -- a bug: say it where a guard's traceback would go
            try:
                import traceback

                traceback.print_exc()
            finally:
                code = 1
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):
                    pass  # a closed pipe: nothing more can be said
            os._exit(code)

    def _run_child(self, args, cwd, env, stdio, report_w: int, go_r: int) -> int:
        operation = "set up its stdio"
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, self.chld_handler)
            for target, fd in enumerate(stdio):  # >= 3: the zygote's own 0-2 are always open
                os.dup2(fd, target)  # inheritable: CMD gets them
            _close_fds_except((0, 1, 2, report_w, go_r, self.parent_fd))
            self.sock.detach()  # its fd is closed: no later close may hit whatever reuses it
            operation = "start a session"
            os.setsid()
            if cwd is not None:
                operation = "chdir"
                os.chdir(cwd)
        except OSError as e:
            _write_failure(report_w, e.errno or 0, operation)
            return EXIT_GUARD_FAILURE
        os.close(report_w)  # set up: the zygote may answer
        # While the zygote answers the supervisor: what changes nothing outside this process.
        os.environ.clear()
        os.environ.update(env)
        turn = args[args.index("--turn") + 1] if "--turn" in args[:-1] else "?"
        linux.set_title(f"ccsup-guard {turn}", "ccsup-guard")  # not the zygote's command line
        if os.read(go_r, 1) != b"g":
            return EXIT_GUARD_FAILURE  # the zygote died before the supervisor knew of us
        os.close(go_r)
        signal.pthread_sigmask(signal.SIG_SETMASK, self.mask)
        from guardd.__main__ import main as guard_main

        return guard_main(list(args), parent_fd=self.parent_fd)


def _write_failure(fd: int, errno_: int, operation: str) -> None:
    try:
        os.write(fd, marshal.dumps((errno_, operation)))
    except OSError:
        pass  # the zygote is gone; the child's exit says enough


def _close_fds_except(keep) -> None:
    low = 0
    for fd in sorted(set(keep)):
        if fd > low:
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))


def _drain(fd: int) -> None:
    while True:
        try:
            if not os.read(fd, 512):
                return
        except BlockingIOError:
            return


def _ensure_stdio() -> None:
    """Fds 0-2 open (on /dev/null if need be), so that no received fd can land on them."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)  # the lowest free number: this one
            if null != fd:
                os.dup2(null, fd)
                os.close(null)


def main(argv: list[str] | None = None) -> int:
    """`python -I -S -c ZYGOTE_BOOTSTRAP --fd N`: serve the supervisor on socket fd N."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] != "--fd" or not argv[1].isdigit():
        print("usage: python -m guardd.zygote --fd N  (started by the supervisor)", file=sys.stderr)
        return 2
    _ensure_stdio()
    sock = socket.socket(fileno=int(argv[1]))
    sock.setblocking(True)
    parent_fd = linux.open_parent_pidfd()
    if parent_fd is None:
        return 0  # the supervisor is already gone
    # Warm: everything a guard imports, once, here.
    import warnings  # noqa: F401  (warm: CMD's os.execvpe imports it between fork and exec)

    import guardd.__main__
    import guardd.hints  # noqa: F401  (warm: a guard with --bus imports it)

    try:
        return _Zygote(sock, parent_fd).serve()
    except (BrokenPipeError, ConnectionResetError):
        return 0  # the supervisor went away while we answered
