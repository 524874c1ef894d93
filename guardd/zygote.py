"""The guard zygote: one warm process per supervisor that forks a guard for each turn.

Design note. A guard started as a fresh interpreter costs ~25-36 ms of CPU (interpreter start and
imports), and at cap 4 on two cores that, not the work, set the pace. The zygote is started once
(`python -I -S -c ZYGOTE_BOOTSTRAP --fd N`, as guards are, see guardd.launch), imports guardd, and
then forks a guard per request (~1-3 ms); the forked child runs `guardd.__main__.main` directly,
with no exec of a new interpreter. It is single-threaded and imports only the standard library, so
a fork copies no lock held by another thread; a guard has no thread either (see Memory below).

The wire (guardd.zygote_wire): requests and answers, marshalled, with fds attached.

One spawn:
1. The zygote forks. The child puts the three fds on 0-2, closes every other fd but three (its
   report pipe, its go pipe, and the pidfd on the supervisor) so that no slot lock, socket or other
   turn's pipe leaks into a guard, calls setsid() (a session of its own, as start_new_session
   did), chdir(cwd), and reports an error, or success (`ok`), on its report pipe; EOF alone
   means it died (killed) before it could say.
2. The zygote opens a pidfd on the child. The child is its own and not reaped yet, so the pid
   cannot have been reused: the pidfd and the start ticks it sends are the child's, race-free.
3. Only after that answer is sent does the zygote write "go" to the child, which then restores the
   signal mask a fresh interpreter has and runs the guard with the request's environment (the
   guard's and CMD's: os.environ stays the zygote's), then os._exit()s with its status (its title
   is set while the zygote answers: nothing outside the child sees it). A child that reads EOF
   instead (the zygote died, or was killed by a supervisor that gave up waiting) exits 125
   without running anything: a guard the supervisor does not know of can never run.

Spares. While it is idle (SPARE_AFTER with nothing to read), the zygote forks up to SPARES
children ahead: each closes what it must not hold, starts its session, and waits on a socketpair
of its own for a request. A spawn is then handed to a spare (the request and its three fds, as it
came) instead of forked: the spare does the rest of step 1 (stdio, cwd), and steps 2 and 3 are the
same, its pidfd opened when it was forked (it is the zygote's unreaped child since).
That takes the fork and the set-up (~1-2 ms) off a turn's start; in a burst the spares are soon
used and the rest are forked as before. A spare whose zygote is gone reads EOF and exits 0; one
that dies unused is reaped without a word, and a request handed to one that died while it waited
(its report is EOF alone) goes to the next spare, or is forked: it is not lost to it.

The guard's parent is the zygote, but "parent gone" must mean the supervisor: the child hands the
guard the zygote's pidfd on the supervisor to watch instead (`main(args, parent_fd=...)`). A
SIGKILLed supervisor thus ends every turn directly, as before; the zygote, watching the same pidfd
(and its socket's EOF), exits too. A zygote that dies leaves its guards running under their
supervisor's watch (they are reparented to the supervisor, a child subreaper too, which reaps
them and ends what they and the zygote's lost guards leave: supervisor.guards.strays).

The zygote is the one reaper of its children (the supervisor cannot waitpid them), so it reports
each spawned child's status over the socket. If it dies first, that status is lost: the supervisor
then has the guard's record (its `exit`, written when CMD exited) and treats a guard with neither as
lost.

Memory. A guard shares the zygote's pages until one of them writes a page (copy on write), and
CPython 3.11 writes to every object it touches (reference counts): a guard's own memory (USS,
~1.8 MiB) is the pages touched after the fork. So the zygote imports, before forking, all that a
guard imports (`warm`; never `threading`, whose at-fork hook would run in every fork), and what
the child runs is kept lean: its environment is handed over as a dict (refilling os.environ cost
~0.3 MiB), signals are set through `_signal` (the enum wrappers cost ~60 KiB). The zygote's own
work between two forks counts too: a page it writes after forking a guard leaves that guard the
only holder of the old copy.

The supervisor's end of the socket is guardd.zygote_handle, the wire guardd.zygote_wire; this
module is the zygote process itself.

State: none on disk. The zygote lives as long as its supervisor and its socket; a supervisor that
starts again starts a new zygote. Its spares live as long as it does: one that ends closes their
sockets and reaps each (they exit at EOF); one killed outright leaves them to read EOF and exit. It has no configuration of its own: every request carries the
guard's arguments, cwd and whole environment.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # signal without its enum wrappers (see uses)
import errno
import marshal
import os
import select
import signal
import socket
import sys

from guardd import linux, procs
from guardd.durations import parse_duration
from guardd.exits import EXIT_GUARD_FAILURE
from guardd.strays import Strays
from guardd.zygote_wire import Inbox, send

SPARES = 2  # children forked ahead while idle (see Spares above)
_SET_UP = b"ok"  # a child's report when it is set up (a failure is marshalled, never this)
SPARE_AFTER = 0.005  # seconds with nothing to read before a spare is forked
DEFAULT_GRACE = 5.0  # a guard's grace when its arguments do not say (guardd.__main__'s default)


def _ignore(signum, frame):
    """SIGCHLD only wakes the loop, through the wakeup fd."""


class _Zygote:
    def __init__(self, sock: socket.socket, parent_fd: int):
        self.sock = sock
        self.parent_fd = parent_fd
        self.inbox = Inbox()
        # Children announced to the supervisor, not yet reaped -> their guard's grace.
        self.spawned: dict[int, float] = {}
        self.strays = Strays(os.getpid(), lambda: self.spawned, self._spare_pids)
        self.spares: list[_Spare] = []  # forked ahead, oldest first
        self.spare_failed = False  # a spare's fork failed: no more tries until the next request
        # What a fresh interpreter has, so that each child gets it back (we change SIGCHLD only).
        self.chld_handler = _signal.getsignal(signal.SIGCHLD)
        self.mask = signal.pthread_sigmask(signal.SIG_BLOCK, ())
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, _ignore)
        self.wake_w = wake_w

    def serve(self) -> int:
        send(self.sock, ("ready", os.getpid()))
        poller = select.poll()
        for fd in (self.sock.fileno(), self.parent_fd, self.wake_r):
            poller.register(fd, select.POLLIN)
        while True:
            wanted = len(self.spares) < SPARES and not self.spare_failed
            idle_ms = int(SPARE_AFTER * 1000) if wanted else -1
            look = self.strays.timeout()
            if look == 0:
                self._report(self.strays.look())  # due even while requests keep us busy
                continue
            if look is not None:
                look_ms = int(look * 1000) + 1
                idle_ms = min(idle_ms, look_ms) if idle_ms >= 0 else look_ms
            ready = {fd for fd, _ in poller.poll(idle_ms)}
            if not ready:
                if wanted and self.strays.timeout() != 0:
                    self._fork_spare()
                continue
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
                    self.spare_failed = False

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self.spawned:  # a child that failed its set-up was never announced
                grace = self.spawned.pop(pid)
                code = os.waitstatus_to_exitcode(status)
                self._report(self.strays.guard_ended(pid, code, grace))
                continue
            for spare in [spare for spare in self.spares if spare.pid == pid]:
                self.spares.remove(spare)  # died unused: nobody was told of it
                spare.close()

    def _report(self, exits: list[tuple[int, int]]) -> None:
        for pid, code in exits:
            send(self.sock, ("exited", pid, code))

    def _spare_pids(self) -> set[int]:
        return {spare.pid for spare in self.spares}

    def _spawn(self, args: list[str], cwd: str | None, env: dict, stdio: list[int]) -> None:
        child = self._hand_to_spare(("spawn", args, cwd, env), stdio)
        if child is None:
            child = self._fork(args, cwd, env, stdio)
            if child is None:
                return
        pid, report, go_w, pidfd = child
        if report != _SET_UP:
            os.close(go_w)
            if pidfd >= 0:
                os.close(pidfd)
            # Its errno and operation, or nothing: it died before it could say (killed).
            errno_, operation = marshal.loads(report) if report else (errno.ESRCH, "set up")
            send(self.sock, ("failed", errno_, operation))
            return  # the child exits 125 at once (or is gone); _reap takes it without a word
        try:
            if pidfd < 0:
                pidfd = os.pidfd_open(pid)  # our unreaped child: certainly still its own pid
            start = procs.start_ticks(pid)
            send(self.sock, ("spawned", pid, start), [pidfd])
        except BaseException:
            os.close(go_w)  # no go: the child exits without running anything
            raise
        finally:
            if pidfd >= 0:
                os.close(pidfd)
        self.spawned[pid] = _grace(args)
        try:
            os.write(go_w, b"g")
        except BrokenPipeError:
            pass  # it died since it was set up: _reap reports its status like any other
        os.close(go_w)

    def _fork(self, args, cwd, env, stdio: list[int]) -> tuple[int, bytes, int, int] | None:
        """A child forked for this request and set up: (pid, its report, go_w, -1); None if fork
        failed (said to the supervisor)."""
        try:
            pid, report_r, go_w, _ = self._fork_child((args, cwd, env, stdio))
        except OSError as e:
            send(self.sock, ("failed", e.errno or 0, "fork"))
            return None
        try:
            return pid, _read_report(report_r), go_w, -1
        finally:
            os.close(report_r)

    def _fork_spare(self) -> None:
        """One child forked ahead, waiting for a request (see Spares in the module's docstring)."""
        try:
            pid, report_r, go_w, mine = self._fork_child(None)
        except OSError:  # out of processes, say: a fork asked for later says why
            self.spare_failed = True  # not tried again every 5 ms meanwhile
            return
        assert mine is not None
        self.spares.append(_Spare(pid, os.pidfd_open(pid), mine, report_r, go_w))

    def _fork_child(self, request: tuple | None) -> tuple[int, int, int, socket.socket | None]:
        """Fork a child for request, or a spare (request None) that waits for one on a socketpair
        of its own: (pid, report_r, go_w, our end of that socketpair). The request's fds are ours
        no more, whatever happens; OSError when fork failed."""
        mine, its = socket.socketpair() if request is None else (None, None)
        stdio = request[3] if request is not None else []
        report_r, report_w = os.pipe()
        go_r, go_w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError:
            for end in (mine, its):
                if end is not None:
                    end.close()
            for fd in (report_r, report_w, go_r, go_w, *stdio):
                os.close(fd)
            raise
        if pid == 0:
            self._child(report_w, go_r, its, request)  # never returns
        if its is not None:
            its.close()
        for fd in (report_w, go_r, *stdio):
            os.close(fd)
        return pid, report_r, go_w, mine

    def _hand_to_spare(
        self, request: tuple, stdio: list[int]
    ) -> tuple[int, bytes, int, int] | None:
        """The request given to the oldest spare that takes it, and that spare set up: (pid, its
        report, go_w, pidfd); None when none did (the request's fds are still ours then)."""
        while self.spares:
            spare = self.spares.pop(0)
            try:
                send(spare.sock, request, stdio)
                report = _read_report(spare.report_r)
            except OSError:
                report = b""
            if not report:  # it died (killed while it waited): the next one, or a fork
                spare.close()
                continue
            spare.sock.close()
            os.close(spare.report_r)
            for fd in stdio:
                os.close(fd)
            return spare.pid, report, spare.go_w, spare.pidfd
        return None

    def _child(self, report_w: int, go_r: int, spare: socket.socket | None, request) -> None:
        """In the forked child: set up as a fresh guard would be (a spare first waits for its
        request on `spare`), wait for go, run the guard.

        Never returns, whatever happens: a child that came back into the zygote's loop would
        serve the supervisor's socket as a second zygote."""
        code = EXIT_GUARD_FAILURE
        try:
            code = self._run_child(report_w, go_r, spare, request)
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

    def _run_child(self, report_w: int, go_r: int, spare: socket.socket | None, request) -> int:
        operation = "set up its stdio"
        try:
            signal.set_wakeup_fd(-1)
            # _signal: signal.signal would turn the old handler (a function) into an enum by
            # raising and catching, pages of the guard's own (as is each page touched here).
            _signal.signal(signal.SIGCHLD, self.chld_handler)
            keep = [0, 1, 2, report_w, go_r, self.parent_fd]
            keep += [spare.fileno()] if spare is not None else request[3]
            _close_fds_except(keep)
            for closed in (self.sock, *(other.sock for other in self.spares)):
                closed.detach()  # its fd is closed: no later close may hit whatever reuses it
            operation = "start a session"
            os.setsid()
            linux.set_name("ccsup-guard")  # once: the title below changes, the name does not
            if spare is not None:
                linux.set_title("ccsup-guard (spare)")
                request = _wait_for_request(spare)
                if request is None:
                    return 0  # the zygote is gone before it had a turn for us
            args, cwd, env, stdio = request
            operation = "set up its stdio"
            for target, fd in enumerate(stdio):  # >= 3: the zygote's own 0-2 are always open
                os.dup2(fd, target)  # inheritable: CMD gets them
            for fd in stdio:
                os.close(fd)
            if cwd is not None:
                operation = "chdir"
                os.chdir(cwd)
        except OSError as e:
            _write_failure(report_w, e.errno or 0, operation)
            return EXIT_GUARD_FAILURE
        os.write(report_w, _SET_UP)  # the zygote may answer (EOF alone: we died)
        os.close(report_w)
        # While the zygote answers the supervisor: what changes nothing outside this process.
        turn = args[args.index("--turn") + 1] if "--turn" in args[:-1] else "?"
        linux.set_title(f"ccsup-guard {turn}")  # not the zygote's command line
        if os.read(go_r, 1) != b"g":
            return EXIT_GUARD_FAILURE  # the zygote died before the supervisor knew of us
        os.close(go_r)
        _signal.pthread_sigmask(signal.SIG_SETMASK, self.mask)
        from guardd.__main__ import main as guard_main

        # The environment goes to the guard as a dict: emptying and refilling os.environ (the
        # zygote's) cost each guard ~0.3 MiB of private memory.
        return guard_main(list(args), parent_fd=self.parent_fd, environ=env)


class _Spare:
    """The zygote's end of a spare: its pid and pidfd, its socket, its report and go pipes."""

    __slots__ = ("pid", "pidfd", "sock", "report_r", "go_w")

    def __init__(self, pid: int, pidfd: int, sock: socket.socket, report_r: int, go_w: int):
        self.pid, self.pidfd, self.sock, self.report_r, self.go_w = pid, pidfd, sock, report_r, go_w

    def close(self, wait: float = 0) -> None:
        """Its socket closed (the spare reads EOF and exits); reaped if it ends within wait."""
        self.sock.close()
        if wait and select.select([self.pidfd], [], [], wait)[0]:
            try:
                os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                pass  # reaped by _reap already
        for fd in (self.pidfd, self.report_r, self.go_w):
            os.close(fd)


def _wait_for_request(sock: socket.socket) -> tuple | None:
    """In a spare: the one request the zygote hands it, (args, cwd, env, stdio); None at EOF."""
    inbox = Inbox()
    sock.setblocking(True)
    while True:
        for message in inbox.messages():
            _, args, cwd, env = message
            stdio = inbox.take_fds(3)
            sock.close()
            return args, cwd, env, stdio
        if not inbox.receive(sock):
            return None


def _grace(args: list[str]) -> float:
    """The guard's --grace (what its strays get between SIGTERM and SIGKILL), else its default."""
    try:
        return parse_duration(args[args.index("--grace") + 1])
    except (ValueError, IndexError):
        return DEFAULT_GRACE


def _read_report(fd: int) -> bytes:
    """A child's report, to its end: _SET_UP, its failure (marshalled), or nothing (it died)."""
    report = b""
    while chunk := os.read(fd, 4096):
        report += chunk
    return report


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


def warm() -> None:
    """Import everything a guard imports, once, before any fork: a module imported in a guard
    is that guard's own memory (os.wait4 alone imports `resource` at its first call: ~0.2 MiB).
    Nothing here may import `threading`: its at-fork hook would run in every fork (~0.4 MiB).

    Then run json's encoder on a record and a hint until the interpreter has specialized its
    code: a guard encodes its record at every change and every scan (and a hint at each event),
    and the code objects each guard would rewrite, specializing them itself, cost it ~70 KiB."""
    import json
    import resource  # noqa: F401
    import warnings  # noqa: F401  (CMD's os.execvpe imports it between fork and exec)

    import guardd.__main__
    import guardd.hints  # noqa: F401  (a guard with --bus)
    from guardd import record

    linux.command_line_span()  # the children's, too: their titles are written there

    group = {"pgid": 1, "leader_start": 2}
    sample = {  # a guard record's shape (guardd.guard.Guard.to_record)
        "v": 1,
        "guard": {"pid": 1, "start": 2},
        "turn": "t",
        "argv": ["true"],
        "own_group": group,
        "groups": [{**group, "seen_at": 0.5}],
        "state": "running",
        "exit": None,
        "reason": None,
        "started_at": 0.5,
        "cgroup": None,
        "usage": {"cpu_user_s": 0.0, "cpu_system_s": 0.0, "peak_rss_bytes": 0, "processes": 1},
    }
    hint = {"v": 1, "ts": 0.5, "turn": "t", "guard": {"pid": 1, "start": 2}, **group}
    for _ in range(12):  # 3.11 specializes a function at its 8th call
        record.encode(sample)
        json.dumps(hint)  # as guardd.hints.Publisher.publish does


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
    linux.register_subreaper()  # a lost guard's strays come to us (guardd.strays)
    warm()
    zygote = _Zygote(sock, parent_fd)
    try:
        return zygote.serve()
    except (BrokenPipeError, ConnectionResetError):
        return 0  # the supervisor went away while we answered
    finally:
        zygote.strays.end_all()
        for spare in zygote.spares:  # each exits at EOF: reaped here, not left to init
            spare.close(wait=1.0)
