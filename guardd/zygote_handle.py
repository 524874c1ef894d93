"""The supervisor's handle on its guard zygote: start it, ask it for guards, collect statuses.

The zygote, its wire and the design note are in guardd.zygote; this is the other end of the
socket, used by supervisor.guards.launcher from the daemon's event loop (not thread-safe). It knows the
zygote's process and socket; nothing of turns or slots.

State: guardd's own `.pyc` files (`compile_package`, before each zygote's start). Written as
import writes them, atomically (a temporary file renamed); one missing, or whose header does not
match its source (another Python's, an older source's), is written again, and one that cannot be
written (a package owned by another user) is left to the zygote's import.
"""

from __future__ import annotations

import os
import select
import socket
import time
from collections import deque

from guardd.launch import zygote_command
from guardd.zygote_wire import Inbox, encode


def compile_package(package: str = os.path.dirname(os.path.abspath(__file__))) -> None:
    """Write the `.pyc` of each module of `package` (guardd) whose `.pyc` is missing or does not
    match its source (compileall reads each one's header). A zygote that imports guardd from
    source compiles it, and the compiler's leftovers then lie among the objects each guard
    touches: the first daemon after an install had guards of 1.94 MiB against 1.82
    (bench_scale.py, N = 50). Nothing is raised or printed: a `.pyc` that cannot be written is
    compiled by the import, as before."""
    import compileall
    import py_compile

    # TIMESTAMP, as import writes them (SOURCE_DATE_EPOCH would make them hash the source).
    timestamp = py_compile.PycInvalidationMode.TIMESTAMP
    compileall.compile_dir(package, maxlevels=0, quiet=2, invalidation_mode=timestamp)


class ZygoteGone(Exception):
    """The zygote has ended (or was ended) and started nothing for this request."""


class Spawned:
    """A guard the zygote forked: its pid, start ticks, and a pidfd on it (ours to close)."""

    __slots__ = ("pid", "start", "pidfd")

    def __init__(self, pid: int, start: int, pidfd: int):
        self.pid, self.start, self.pidfd = pid, start, pidfd


class Failed:
    """The zygote's answer when a guard's child could not be set up: the errno and the step."""

    __slots__ = ("errno", "operation")

    def __init__(self, errno_: int, operation: str):
        self.errno, self.operation = errno_, operation

    def error(self, cwd: str | None) -> OSError:
        """The OSError Popen would have raised for the same failure."""
        if self.operation == "chdir":
            return OSError(self.errno, os.strerror(self.errno), cwd)
        return OSError(self.errno, f"{os.strerror(self.errno)} ({self.operation})")


class _Outgoing:
    """A request not wholly sent yet: its bytes left, and the fds that go with its first byte."""

    __slots__ = ("data", "fds")

    def __init__(self, data: memoryview, fds: list[int]):
        self.data, self.fds = data, fds


class Zygote:
    """The supervisor's end: start the zygote, ask it for guards, collect their exit statuses.

    Not thread-safe; one caller (the daemon's event loop). Two ways to ask:
    - pipelined (the daemon's): `request()` queues a spawn and returns at once, `flush()` sends what
      the socket takes without blocking (again when it is writable), and `answers()` gives the
      answers read so far, in request order (the zygote answers one request after another);
    - blocking (`spawn`): one request, waiting for its answer (~1-3 ms: a fork); never while
      pipelined requests wait (their answers would be taken for its own).
    `fileno()` turns readable when answers, reports or EOF arrive; `poll_reports()` gives each
    reaped guard's status.
    """

    def __init__(self, proc, sock: socket.socket):
        self.proc = proc
        self.sock = sock
        self.inbox = Inbox()
        self.reports: list[tuple[int, int]] = []
        self.replies: list[tuple] = []
        self.outbox: deque[_Outgoing] = deque()
        self.alive = True
        self.ready = False  # it said it was (it had imported guardd and could fork)
        self.answered = 0  # requests it answered (spawned or failed)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def fileno(self) -> int:
        return self.sock.fileno()

    @classmethod
    def start(cls, python: str | None = None, timeout: float = 10.0) -> Zygote:
        """Start a zygote and wait until it is ready. OSError or ZygoteGone when it cannot be."""
        zygote = cls.launch(python)
        try:
            zygote.wait_ready(timeout)
        except BaseException:
            zygote.close(timeout=0)
            raise
        return zygote

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Block until it says it is ready (its first word). ZygoteGone when it ends first, says
        anything else, or takes longer than timeout (then it is killed)."""
        try:
            reply = self._await_reply(time.monotonic() + timeout)
        except TimeoutError:
            self.kill()
            raise ZygoteGone(f"the zygote was not ready within {timeout:g} s") from None
        if reply[0] != "ready":
            self.kill()
            raise ZygoteGone(f"the zygote answered {reply[0]!r} instead of ready")
        self.ready = True

    @classmethod
    def launch(cls, python: str | None = None) -> Zygote:
        """Start a zygote without waiting for it (OSError when its process cannot be started):
        for the pipelined way only. Requests may be queued at once; it answers them once it is
        ready (its "ready" comes first and is not an answer), and a zygote that dies before is
        gone like any other (EOF)."""
        import subprocess

        compile_package()  # its image read from .pyc files (see compile_package)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            proc = subprocess.Popen(
                zygote_command(["--fd", str(theirs.fileno())], python),
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                start_new_session=True,  # nothing of a terminal reaches it, as with guards
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        return cls(proc, ours)

    def spawn(
        self,
        args: list[str],
        *,
        cwd: str | None,
        env: dict,
        stdio: tuple[int, int, int],
        timeout: float = 5.0,
    ) -> Spawned:
        """Fork a guard running `ccsup-guard ARGS` with these stdio fds (the caller closes its
        copies after). OSError: the child could not be set up (its errno, e.g. a bad cwd).
        ValueError: the request is too large for the wire. ZygoteGone: the zygote is gone or was
        given up here, and no guard runs for this request: start it another way."""
        data = encode(("spawn", list(args), cwd, env))
        if not self.alive:
            raise ZygoteGone("the zygote has already ended")
        deadline = time.monotonic() + timeout
        try:
            self._send_request(data, list(stdio), deadline)
            reply = self._await_reply(deadline)
        except TimeoutError:
            # Stuck (stopped, or starved): end it. What it sent before dying still counts; a
            # child it forked but did not announce reads EOF for its go and never runs a guard.
            self._stop(kill=True)
            self._read_available()
            if not self.replies:
                raise ZygoteGone(
                    f"the zygote did not answer within {timeout:g} s; it was killed"
                ) from None
            reply = self.replies.pop(0)
        if reply[0] == "spawned":
            (pidfd,) = self.inbox.take_fds(1)
            return Spawned(reply[1], reply[2], pidfd)
        if reply[0] == "failed":
            errno_, operation = reply[1], reply[2]
            if operation == "chdir":
                raise OSError(errno_, os.strerror(errno_), cwd)  # what Popen raises
            raise OSError(errno_, f"{os.strerror(errno_)} ({operation})")
        raise ZygoteGone(f"the zygote answered {reply[0]!r} to a spawn")

    def request(
        self, args: list[str], *, cwd: str | None, env: dict, stdio: tuple[int, int, int]
    ) -> None:
        """Queue a spawn of `ccsup-guard ARGS` with these stdio fds, without waiting: the fds are
        the handle's from now on (closed once sent, or when the zygote is gone). Its answer comes,
        in order, from `answers()`. ValueError (too large for the wire) and ZygoteGone leave the
        fds with the caller."""
        data = encode(("spawn", list(args), cwd, env))
        if not self.alive:
            raise ZygoteGone("the zygote has already ended")
        self.outbox.append(_Outgoing(memoryview(data), list(stdio)))

    def flush(self) -> bool:
        """Send what the socket takes now; True when nothing is left to send.

        ZygoteGone when it is gone (what was not sent is dropped and its fds closed)."""
        while self.outbox:
            out = self.outbox[0]
            try:
                if out.fds:
                    sent = socket.send_fds(self.sock, [out.data], out.fds)
                else:
                    sent = self.sock.send(out.data)
            except BlockingIOError:
                return False
            except OSError as e:  # EPIPE, ECONNRESET: it is gone
                self._gone()
                raise ZygoteGone(f"unable to send to the zygote: {e.strerror}") from None
            for fd in out.fds:  # in flight now: the kernel holds them for the zygote
                os.close(fd)
            out.fds = []
            out.data = out.data[sent:]
            if not out.data:
                self.outbox.popleft()
        return True

    def answers(self) -> list[Spawned | Failed]:
        """The answers read so far to the requests, in request order (reads what is there).

        OSError when the stream is broken (an answer without its pidfd)."""
        if self.sock.fileno() >= 0:
            self._read_available()
        answers: list[Spawned | Failed] = []
        while self.replies:
            reply = self.replies.pop(0)
            if reply[0] == "spawned":
                (pidfd,) = self.inbox.take_fds(1)
                answers.append(Spawned(reply[1], reply[2], pidfd))
            elif reply[0] == "failed":
                answers.append(Failed(reply[1], reply[2]))
            elif reply[0] == "ready":  # a launched zygote's first word: no request's answer
                self.ready = True
            else:
                raise OSError(f"unable to read the zygote's answer: {reply[0]!r}")
        self.answered += len(answers)
        return answers

    def kill(self) -> None:
        """End a zygote that stopped answering; what it sent before still counts (`answers()`).
        A child it forked but did not announce reads EOF for its go and runs nothing."""
        self._stop(kill=True)

    def poll_reports(self, read: bool = True) -> list[tuple[int, int]]:
        """(pid, returncode) of every guard reaped since the last call; reads what is there first,
        unless read is False: a caller that reads through `answers()` takes the reports that read
        brought, without reading answers that would then wait for the socket's next event."""
        if read and self.alive:
            self._read_available()
        reports, self.reports = self.reports, []
        return reports

    def close(self, timeout: float = 2.0) -> None:
        """Stop the zygote (EOF on its socket) and reap it; killed after `timeout`."""
        self.alive = False
        if self.sock.fileno() >= 0:
            self.sock.close()
        self._drop_outbox()
        if self.proc.poll() is None:
            import subprocess

            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.inbox.close()

    # -- internals ------------------------------------------------------------------------------

    def _drop_outbox(self) -> None:
        while self.outbox:
            for fd in self.outbox.popleft().fds:
                os.close(fd)

    def _stop(self, kill: bool) -> None:
        self.alive = False
        self._drop_outbox()
        if kill and self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def _send_request(self, data: bytes, fds: list[int], deadline: float) -> None:
        view = memoryview(data)
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLOUT | select.POLLIN)
        while view:
            try:
                sent = socket.send_fds(self.sock, [view], fds) if fds else self.sock.send(view)
            except BlockingIOError:
                sent = 0
            except OSError as e:  # EPIPE, ECONNRESET: it is gone
                self._gone()
                raise ZygoteGone(f"unable to send to the zygote: {e.strerror}") from None
            if sent:
                view, fds = view[sent:], []
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            for _, event in poller.poll(left * 1000):
                if event & select.POLLIN:  # read its reports meanwhile: it may be blocked on them
                    self._read_available()
                    if not self.alive:
                        raise ZygoteGone("the zygote ended while we sent a request")

    def _await_reply(self, deadline: float) -> tuple:
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLIN)
        while not self.replies:
            if not self.alive:
                raise ZygoteGone("the zygote ended without answering")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            if poller.poll(left * 1000):
                self._read_available()
        return self.replies.pop(0)

    def _read_available(self) -> None:
        while True:
            try:
                more = self.inbox.receive(self.sock)
            except BlockingIOError:
                more = True
                break
            except OSError:
                more = False
            finally:
                for message in self.inbox.messages():
                    if message[0] == "exited":
                        self.reports.append((message[1], message[2]))
                    else:
                        self.replies.append(message)
            if not more:
                break
        if not more:
            self._gone()

    def _gone(self) -> None:
        """EOF or a reset: it exited (or is exiting, and its socket is all it had for us)."""
        if self.alive:
            self._stop(kill=True)  # already ending; a kill only makes the wait short
