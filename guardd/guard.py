"""The guard's loop: run CMD in a group of its own, watch every group its work creates, end it all.

Design note (why it is built this way).
- One reaper. Every child, CMD and every orphan reparented to us as a child subreaper, is reaped by
  `_reap` alone, with waitpid(-1). A second reaper (subprocess.Popen.wait) would steal statuses:
  Popen would report 0 for a child that exited 7. So CMD is started without Popen.
- Signal handlers only wake the loop: Python writes each signal number to a self-pipe
  (signal.set_wakeup_fd); the loop, the process's only thread, polls that pipe, the parent's
  pidfd, the hints' socket (guardd.hints) and a timer for scans. Handlers are installed, and those
  signals unblocked, before CMD starts.
- CMD is started by guardd.child (a clone in C, guardd._spawn, or a bare fork, then exec, for the
  reasons given there); what runs between fork and exec is there too. guardd.exits holds the exit
  statuses and CMD's `Exit`, guardd.options what the guard was asked to do.
- Groups are signalled with killpg only after `procs.same_groups` said the recorded group (pgid
  and leader start) is still the same: a reaped group's id can be reused. That judgment never
  reads all of /proc (a group of zombies is signalled too: it ignores the signal, and its
  zombies pin its id); each group is signalled once a round.
  Single processes are signalled by identity through a pidfd (`procs.signal_process`).
- Judging "gone": reap first (a zombie keeps killpg(pgid, 0) succeeding), then `live_groups`,
  which counts zombies as gone, and finally "no child left" (waitpid says ECHILD): as a subreaper
  every descendant whose parent died is our child, so no child means no descendant.
- A group whose leader is alive but not one of our descendants belongs to someone else (CMD may
  join a group of the guard's session): it is never recorded; its members that are ours are still
  signalled one by one.
- With `--tty` (a turn with `stdin: "tty"`: the supervisor hands the guard a pty's slave as its
  stdin, and with `--log-dir` a master on fd 2 that the guard holds and reads, guardd.pty), CMD gets a session of its own, not only a group,
  with the pty as its controlling terminal (guardd.child), since only a session leader can take
  one. The containment model is the same: the session's first group is the own group (pgid = CMD's
  pid), a job-control shell's other groups are recorded as any other, the subreaper and the cgroup
  are as before, and the guard's own session has no terminal, so ^C on the pty reaches CMD's
  foreground group and never the guard. The end is unchanged too; when CMD, the session's leader,
  exits, the kernel also hangs up (SIGHUP) the terminal's foreground group.
- With `--adopt-within` the guard outlives its supervisor (guardd.channel): it writes CMD's output
  itself (guardd.output) and holds a writer of CMD's stdin pipe (guardd.stdin) or its pty's master
  (guardd.pty), so neither breaks while no supervisor runs.
- Size: past 600 lines and still one concept, the loop and the steps of one turn's life it calls;
  what stands apart is in modules of its own (child, output, stdin, pty, channel, scan, record).

State. The record `<record-dir>/<guard pid>-<guard start>.json` is rewritten atomically at start
and at every change (guardd.record.Rewriter: a spare beside it until the last write). A guard
killed outright leaves both, state "running" (or "stopping") and its groups: the supervisor's
reaper ends those groups. A guard that runs again is a new process with a new identity and a new
record; it never reads old ones. A guard that cannot end the work exits 125 and leaves state
"stopping" with a reason. Where the guard is in all this is one `Phase`, changed only by
`Guard._change(event)` through one table, `CHANGES` (s6's `actions[state][event]`): running ->
terminating -> killing -> gone, gone from any of them once the work is all gone, and from running
when CMD cannot start; a change the table does not have is a GuardFailure (exit 125), never a
silent one. The record's `state` is read from the phase (`_record_state`: both stopping phases
write "stopping"). Once CMD has exited, what of its tree still runs is named in the record
(`leftovers`, guardd.leftovers) before anything is signalled, in the same write as the exit.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # signal without its enum wrappers (see uses)
import enum
import os
import select
import signal
import sys
import time

from guardd import (
    cgroup,
    channel,
    child,
    deadman,
    leftovers,
    linux,
    output,
    procs,
    pty,
    record,
    scan,
    stdin,
    usage,
)
from guardd.exits import EXIT_GUARD_FAILURE, Exit

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the guard's start pays)
if TYPE_CHECKING:
    from guardd.hints import Publisher
    from guardd.options import Options

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_WATCHED_SIGNALS = (signal.SIGCHLD, *_STOP_SIGNALS)
# While stopping, the loop wakes on SIGCHLD (the last descendant is our child: subreaper), the
# cgroup's `populated` and the deadline, and scans for groups made after the SIGTERM after 50 ms,
# then twice as long each time up to 400 ms (their SIGKILL comes at the grace's end anyway). A poll
# every 20 ms made 500 guards stopping at once wake 25,000 times a second: most of the stop's CPU.
_STOP_SCAN = 0.05
_STOP_SCAN_MAX = 0.4
_GIVE_UP_GRACES = 10
_MIN_GIVE_UP = 1.0  # seconds; so that --grace 0 does not give up at once
_DEADLINE_POLL = 0.25  # seconds: how late a suspended-then-resumed machine may see its deadline


class Phase(enum.StrEnum):
    """Where the guard is in ending the turn's work (the loop's one state)."""

    RUNNING = "running"  # CMD runs; nothing is being ended
    TERMINATING = "terminating"  # SIGTERM sent to every group; the grace runs
    KILLING = "killing"  # the grace is over: SIGKILL each round until all is gone, else give up
    GONE = "gone"  # the work is all gone (or CMD never started): the record's last state


# Module names, so that the loop reads a global, not an attribute of the class, at each check.
RUNNING, TERMINATING, KILLING, GONE = Phase.RUNNING, Phase.TERMINATING, Phase.KILLING, Phase.GONE


# What happens to the guard, the events of CHANGES.
STOP = "stop"  # a stop signal, the parent's end, not adopted, the deadline, CMD's exit leaving work
GRACE_OVER = "grace_over"  # the grace after SIGTERM has run out
ALL_GONE = "all_gone"  # CMD has exited and nothing of the work lives
START_FAILED = "start_failed"  # CMD never started (guardd.child's failure)

# (phase, event) -> the next phase; a pair not here is refused. Keyed by the phases' string values
# (`_value_`: plain interned str whose hash is computed once, in C), not by the members: a lookup
# in the forked guard goes through no enum machinery (only reference counts are touched).
CHANGES: dict[tuple[str, str], Phase] = {
    ("running", STOP): TERMINATING,
    ("running", ALL_GONE): GONE,
    ("running", START_FAILED): GONE,
    ("terminating", GRACE_OVER): KILLING,
    ("terminating", ALL_GONE): GONE,
    ("killing", ALL_GONE): GONE,
}


def next_phase(phase: Phase, event: str) -> Phase:
    """Where `event` takes the guard from `phase` (CHANGES); GuardFailure when nowhere."""
    found = CHANGES.get((phase._value_, event))
    if found is None:
        raise GuardFailure(f"unable to change phase {phase._value_} on {event}: not a change")
    return found


def _record_state(phase: Phase) -> str:
    """The record's `state`, which the supervisor reads: both stopping phases are "stopping" (and
    a guard that gave up stays so). Compared by identity: the cheapest test there is. No enum code
    would run either way (a StrEnum member hashes and compares as a str: `Phase.__hash__` is
    `str.__hash__`, `Phase.__eq__` is `str.__eq__`, both in C), but `is` needs neither."""
    if phase is RUNNING:
        return "running"
    return "gone" if phase is GONE else "stopping"


class GuardFailure(Exception):
    """The guard itself failed (exit 125): the message names the operation and the reason."""


def _ignore(signum, frame):
    """The handler only exists so the signal wakes the loop through the wakeup fd."""


def new_turn_id() -> str:
    return "g" + os.urandom(6).hex()


class Guard:
    def __init__(self, opts: Options, clock=time.monotonic, parent_fd: int | None = None):
        """parent_fd: a pidfd on the process whose end ends the turn, given by a launcher that is
        not that process itself (guardd.zygote passes the supervisor's); default: the parent."""
        self.opts = opts
        self.clock = clock
        pid = os.getpid()
        me = procs.identity_of(pid)
        assert me is not None  # our own /proc entry exists while we run
        self.me = me
        self.my_pgid = os.getpgrp()
        self.turn = self.opts.turn or new_turn_id()
        self.started_at = time.time()
        self.cwd = _cwd()  # the turn's (the guard is started in it): recorded beside argv
        self.record_file = (
            record.record_file(self.opts.record_dir, self.me) if self.opts.record_dir else None
        )
        self.recorder = record.Rewriter(self.record_file) if self.record_file else None
        self.cmd_pid: int | None = None
        self.own: procs.Group | None = None
        self.groups: dict[procs.Group, float] = {}  # group -> seen_at, in the order seen
        self.by_pgid: dict[int, procs.Group] = {}  # the latest recorded group of each pgid
        self.descendants: dict[int, procs.Stat] = {}
        self.scanner = scan.Scanner(pid)  # holds /proc files of what it saw: cheaper rescans
        self.exit: Exit | None = None
        self.leftovers: dict | None = None  # what outlived CMD (guardd.leftovers), once it exited
        self.leftovers_noted = False
        self.exited_at: float | None = None  # epoch: when CMD was reaped (the record's exited_at)
        self.exit_told = False  # the exited hint is sent once
        self.phase = RUNNING  # changed only by _change (CHANGES)
        self.reason: str | None = None
        self.has_children = True
        self.deadline = 0.0
        self.eperm: list[str] = []
        self.usage = usage.Usage(self.opts.cgroup)
        self._next_stop_scan = 0.0
        self._next_sample = 0.0  # the tree's memory is sampled at most once a scan interval
        self._stop_scan_every = _STOP_SCAN
        self._give_up_after = max(_GIVE_UP_GRACES * self.opts.grace, _MIN_GIVE_UP)
        self._record_due = False  # a change to write at the end of the loop's pass
        self.hints: Publisher | None = None
        self.poller = select.poll()  # the loop's; the hints' socket is registered here too
        self.parent_fd: int | None = None
        self._given_parent_fd = parent_fd
        # The dead-man deadline (guardd.deadman), on CLOCK_BOOTTIME; re-read only when it comes.
        self.stop_at = float("inf")
        self.kill_at = float("inf")
        # CMD's output, kept by the guard itself (guardd.output) when it is given a log directory.
        self.logs = output.Logs(opts.log_dir, opts.log_limit) if opts.log_dir else None
        self._truncation_recorded = False
        # Adoption (guardd.channel): with adopt_within, a supervisor gone is waited for that long.
        self.channel: channel.Listener | None = None
        self.waiting_since: float | None = None  # epoch: when the watched supervisor was gone
        self.adopt_by = float("inf")  # on self.clock
        self.adopted_at: float | None = None
        self.stdin_writer: int | None = None  # CMD's stdin pipe, held across a gap (guardd.stdin)
        self.pty_master: int | None = None  # a "tty" turn's pty, read into the log (guardd.pty)
        self.start_pipe: int | None = None  # closed once CMD runs and is on record (_open_logs)
        self._adopting: dict[int, int] = {}  # connection fd -> the adopter's pidfd, until its ack

    # --- the whole life, one call per step --------------------------------------------------

    def run(self) -> int:
        wake_fd = self._install_signals()
        if self.logs is not None:
            self._open_logs()  # first: what the guard says from now on reaches the stderr log
        linux.register_subreaper()
        self.parent_fd = (
            self._given_parent_fd
            if self._given_parent_fd is not None
            else linux.open_parent_pidfd()
        )
        if self.opts.record_dir:
            self._prepare_record_dir(self.opts.record_dir)
        if self.opts.adopt_within > 0 and self.record_file is not None:
            self._open_channel(self.record_file)
            self._hold_stdin()  # before CMD runs: see guardd.stdin
        if self.opts.cgroup is not None:
            self._prepare_cgroup()
        failed = self._spawn_cmd()
        if failed is not None:
            return failed
        self._write_record()
        self._close_start_pipe()  # CMD runs and the record names the channel: see _open_logs
        if self.opts.bus:
            from guardd.hints import Publisher

            self.hints = Publisher(self.opts.bus, self.turn, self.me.to_json(), self.poller)
        if self.opts.deadline_file is not None:
            self.stop_at = 0.0  # read at the loop's first pass
        return self._loop(wake_fd)

    def _install_signals(self) -> int:
        rfd, wfd = os.pipe()
        os.set_blocking(rfd, False)
        os.set_blocking(wfd, False)
        signal.set_wakeup_fd(wfd, warn_on_full_buffer=False)
        # _signal: signal's wrappers make enums of handlers and masks (~60 KiB of a forked guard)
        for sig in _WATCHED_SIGNALS:
            _signal.signal(sig, _ignore)
        # A parent may have blocked them; handlers come first so a pending one is not fatal.
        _signal.pthread_sigmask(signal.SIG_UNBLOCK, _WATCHED_SIGNALS)
        return rfd

    def _open_logs(self) -> None:
        assert self.logs is not None
        # The stdout the guard was started with is the supervisor's start pipe (see
        # supervisor.guards.handle.open_stdio): kept, close-on-exec, until CMD runs and the record
        # is written, so its end tells the supervisor that a turn is adoptable from then on.
        try:
            self.start_pipe = os.dup(1)
        except OSError:
            pass  # no stdout: nobody waits for its end
        if self.opts.tty:
            try:
                self.pty_master = pty.take_master()
            except OSError as e:
                raise GuardFailure(f"unable to hold the terminal: {e.strerror or e}") from None
        try:
            self.logs.open(self.pty_master)
        except OSError as e:
            why = f"unable to open the logs in {self.opts.log_dir}: {e.strerror}"
            raise GuardFailure(why) from None
        for fd in self.logs.fds:
            self.poller.register(fd, select.POLLIN)

    def _close_start_pipe(self) -> None:
        if self.start_pipe is not None:
            os.close(self.start_pipe)
            self.start_pipe = None

    def _open_channel(self, record_file: str) -> None:
        path = channel.channel_file(record_file)
        try:
            self.channel = channel.Listener(path)
        except OSError as e:
            raise GuardFailure(f"unable to open the channel {path}: {e.strerror or e}") from None
        self.poller.register(self.channel.fileno(), select.POLLIN)

    def _hold_stdin(self) -> None:
        if self.opts.tty:
            return  # a pty: the master we hold is handed over instead (guardd.pty)
        try:
            self.stdin_writer = stdin.hold(0)
        except OSError as e:  # CMD then reads EOF if the supervisor dies, as without adopt_within
            _say(f"unable to hold the stdin of turn {self.turn}: {e.strerror or e}")

    def _on_channel(self, fd: int) -> None:
        """A supervisor's connection (accepted), its adopt (answered), or its ack (committed).

        Two steps: the guard watches its adopter only once the adopter has read the answer and
        said so (`ack`). An adopter that gave up waiting (this guard was stopped or starved) has
        closed its end instead, and the guard goes on waiting: it never watches a supervisor that
        does not know it adopted it."""
        assert self.channel is not None
        if fd == self.channel.fileno():
            conn = self.channel.accept()
            if conn is not None:
                self.poller.register(conn.fileno(), select.POLLIN)
            return
        message, passed = self.channel.receive(fd)
        if message is None:
            if fd not in self.channel.conns:  # closed (EOF, or not a message)
                self.poller.unregister(fd)
                pending = self._adopting.pop(fd, None)
                if pending is not None:
                    os.close(pending)  # the adopter gave up before its ack: still waiting
            return
        if fd in self._adopting:
            adopter = self._adopting.pop(fd)
            self.poller.unregister(fd)
            self.channel.close_conn(fd)
            if passed is not None:
                os.close(passed)
            if message.get("op") != "ack" or self.phase is not RUNNING:
                os.close(adopter)
                return
            self._adopted_by(adopter)
            return
        self.poller.unregister(fd)
        op = message.get("op")
        error = None
        if message.get("v") != channel.CHANNEL_VERSION:
            error = f"channel version {message.get('v')!r} is not {channel.CHANNEL_VERSION}"
        elif op == "adopt":
            if passed is None:
                error = "no pidfd came with the adopt"
            elif self.phase is not RUNNING:
                error = "the turn is already being ended"
            else:
                self._answer_adopt(fd, passed)
                return
        elif op == "close_stdin":
            self._close_stdin()
        else:
            error = f"unknown op {op!r}"
        if passed is not None:
            os.close(passed)
        body = {"ok": False, "error": error} if error is not None else {"ok": True}
        self.channel.answer(fd, body)

    def _answer_adopt(self, fd: int, pidfd: int) -> None:
        """Answer an adopt (with the stdin writer, or the pty's master, if one is held); committed
        at its ack."""
        assert self.channel is not None
        handed = self.stdin_writer if self.stdin_writer is not None else self.pty_master
        waited = time.time() - self.waiting_since if self.waiting_since is not None else 0.0
        body = {
            "ok": True,
            "turn": self.turn,
            "guard": self.me.to_json(),
            "waited_s": waited,
            "stdin": handed is not None,
        }
        if self.channel.answer(fd, body, pass_fd=handed, keep=True):
            self.poller.register(fd, select.POLLIN)  # its ack comes on it
            self._adopting[fd] = pidfd
        else:
            os.close(pidfd)

    def _adopted_by(self, adopter: int) -> None:
        """Watch the adopter (a pidfd) from now on, instead of whoever came before."""
        if self.parent_fd is not None:
            self.poller.unregister(self.parent_fd)
            os.close(self.parent_fd)
        self.parent_fd = adopter
        self.poller.register(adopter, select.POLLIN)
        self.waiting_since, self.adopt_by = None, float("inf")
        self.adopted_at = time.time()
        self._write_record()

    def _close_stdin(self) -> None:
        """The supervisor's deliberate EOF (op close_stdin): our writer goes, its own next."""
        if self.stdin_writer is not None:
            os.close(self.stdin_writer)
            self.stdin_writer = None

    def _parent_gone(self) -> None:
        """The watched supervisor is gone: wait to be adopted (adopt_within), or end the turn."""
        if self.channel is None or self.phase is not RUNNING:
            self._begin_stop("parent_gone")
            return
        self.waiting_since = time.time()
        self.adopt_by = self.clock() + self.opts.adopt_within
        self._record_due = True

    def _prepare_record_dir(self, record_dir: str) -> None:
        try:
            os.makedirs(record_dir, exist_ok=True)
        except OSError as e:
            raise GuardFailure(
                f"unable to create record directory {record_dir}: {e.strerror}"
            ) from None

    def _prepare_cgroup(self) -> None:
        assert self.opts.cgroup is not None
        try:
            cgroup.create(self.opts.cgroup)
        except OSError as e:
            raise GuardFailure(str(e)) from None

    def _spawn_cmd(self) -> int | None:
        """Start CMD (guardd.child); None when it runs, else the exit code to return."""
        env = dict(self.opts.env)
        env[record.TURN_ENV] = self.turn
        scope = record.record_dir_scope(self.opts.record_dir) if self.opts.record_dir else None
        if scope is not None:
            env[record.SCOPE_ENV] = scope  # the reaper of this state directory's only
        pid, failed = child.start(
            self.opts.argv, env, self.opts.cgroup, watch=self.parent_fd, tty=self.opts.tty
        )
        self.cmd_pid = pid
        if failed is None:
            self.own = procs.Group(pid, procs.start_ticks(pid))
            return None
        if pid:  # the loop (the one reaper) has not started and this is our only child
            os.waitpid(pid, 0)
        self.has_children = False
        self.reason = failed.reason
        _say(failed.message)
        self.exit = Exit(failed.code, None)
        self._change(START_FAILED)
        self._write_record(last=True)
        return failed.code

    def _loop(self, wake_fd: int) -> int:
        poller = self.poller
        poller.register(wake_fd, select.POLLIN)
        if self.parent_fd is not None:
            poller.register(self.parent_fd, select.POLLIN)
        events_fd = self._watch_cgroup(poller)
        next_scan = self.clock() + self.opts.scan
        while True:
            timeout = next_scan - self.clock()
            if self.phase is not RUNNING:
                timeout = min(self._next_stop_scan, self.deadline) - self.clock()
            elif self.opts.deadline_file is not None:
                timeout = min(timeout, self._check_deadline())
            if self.hints is not None:
                timeout = min(timeout, self.hints.timeout())
            if self.waiting_since is not None:
                timeout = min(timeout, self.adopt_by - self.clock())
            events = poller.poll(max(0, int(timeout * 1000) + 1))
            sigs = set()
            for fd, _ in events:
                if self.logs is not None and fd in self.logs.fds:
                    self.logs.read(fd)
                    if self.logs.truncated is not None and not self._truncation_recorded:
                        self._truncation_recorded = self._record_due = True
                elif fd == wake_fd:
                    sigs.update(_drain(wake_fd))
                elif fd == events_fd:
                    cgroup.rearm(events_fd)  # populated changed: the checks below look
                elif fd == self.parent_fd:
                    poller.unregister(fd)
                    os.close(fd)
                    self.parent_fd = None
                    self._parent_gone()
                elif self.channel is not None and (
                    fd == self.channel.fileno() or fd in self.channel.conns
                ):
                    self._on_channel(fd)
            if self.hints is not None:
                self.hints.step(events)  # its socket's events, then its deadlines
            for sig in _STOP_SIGNALS:
                if sig in sigs:
                    self._begin_stop(f"signal:{signal.Signals(sig).name}")
            if self.waiting_since is not None and self.clock() >= self.adopt_by:
                self.waiting_since = None  # nobody came: the dead-man ends the work
                self._begin_stop("not_adopted")
            cmd_exited = self._reap()
            if cmd_exited:
                if self.phase is RUNNING and self._all_gone():
                    # The common end: CMD exited and left nothing. One record write says both.
                    self.reason = "exited"
                    return self._finish()
                if self.phase is RUNNING:
                    self._begin_stop("exited")  # writes the record, exit and leftovers included
                else:
                    self._scan()  # CMD ended while being stopped: what still runs outlived it
                    self._note_leftovers()
                    self._record_due = True  # at the end of this pass, with "gone" if all is
            now = self.clock()
            if self.phase is not RUNNING:
                # Spaced (_STOP_SCAN): orphans dying wake the loop all the time, a scan costs.
                if now >= self._next_stop_scan:
                    self._scan()
                    self._next_stop_scan = now + self._stop_scan_every
                    self._stop_scan_every = min(2 * self._stop_scan_every, _STOP_SCAN_MAX)
            elif signal.SIGCHLD in sigs or now >= next_scan:
                self._scan()
                next_scan = now + self.opts.scan
            if self.phase is not RUNNING:
                if self._all_gone():
                    return self._finish()
                if self.phase is TERMINATING and self.clock() >= self.deadline:
                    self._change(GRACE_OVER)
                    self._scan()  # scans were spaced: what started since the last one dies too
                    self._kill_all()
                    self.deadline = self.clock() + self._give_up_after
                elif self.phase is KILLING:
                    if self.eperm or self.clock() >= self.deadline:
                        return self._give_up()
                    self._kill_all()
            if self._record_due:
                self._write_record()

    def _watch_cgroup(self, poller: select.poll) -> int | None:
        """The loop wakes at the end of the last process of the turn without polling for it."""
        fd = cgroup.watch_events(self.opts.cgroup) if self.opts.cgroup is not None else None
        if fd is not None:  # None: the checks still read cgroup.events by path
            poller.register(fd, select.POLLPRI)
        return fd

    def _check_deadline(self) -> float:
        """Act on the dead-man deadline; returns how long the loop may sleep before it looks again.

        poll() sleeps on CLOCK_MONOTONIC, which stops while the machine is suspended: the sleep is
        capped so that a resumed machine notices a passed deadline within _DEADLINE_POLL.
        """
        path = self.opts.deadline_file
        now = deadman.boottime()
        if path is not None and now >= self.stop_at:
            self.stop_at, self.kill_at, why = deadman.read_deadline(path)
            if now >= self.stop_at:
                late = now >= self.kill_at
                self._begin_stop(f"deadline: {why}" if why else "deadline")
                if late:  # the time the grace was meant to fit in has passed: no grace left
                    self.deadline = self.clock()
                return 0.0
        return min(self.stop_at - now, _DEADLINE_POLL)

    # --- reaping, scanning, stopping -----------------------------------------------------------

    def _reap(self) -> bool:
        """Reap every child that has ended; True when CMD was among them."""
        cmd_exited = False
        while True:
            try:
                pid, status, rusage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                self.has_children = False
                return cmd_exited
            if pid == 0:
                self.has_children = True
                return cmd_exited
            self.usage.reaped(pid, rusage)
            if pid == self.cmd_pid and self.exit is None:
                self.exit = Exit.from_status(status)
                self.exited_at = time.time()
                cmd_exited = True
                if self.logs is not None:
                    self.logs.drain()  # CMD's last bytes are logged before its exit is recorded

    def _scan(self) -> None:
        found = self.scanner.descendants()
        self.descendants = found
        self.usage.seen(found)
        if self.phase is RUNNING and self.clock() >= self._next_sample:
            self._next_sample = self.clock() + self.opts.scan
            self.usage.sample(found)
        changed = self.usage.due(self.clock())  # figures so far reach the record (ps) now and then
        new: list[procs.Group] = []
        own_pgid = self.own.pgid if self.own else None
        for proc in found.values():
            pgid = proc.pgid
            if pgid in (self.my_pgid, own_pgid) or pgid <= 0:
                continue  # -1: a process being reaped (its stat has no group); killpg(-1) is EINVAL
            leader = found.get(pgid)
            known = self.by_pgid.get(pgid)
            if known is not None and (leader is None or leader.start == known.leader_start):
                continue  # already recorded (a leader with a new start is a new group: the id
                # was free again, so the old group had ended)
            if leader is None:
                stat = procs.read_stat(pgid)
                if stat is not None:
                    continue  # the leader lives and is not ours: not a group the turn made
                group = procs.Group(pgid, None)
            else:
                group = procs.Group(pgid, leader.start)
            self.groups[group] = time.time()
            self.by_pgid[pgid] = group
            changed = True
            new.append(group)
            if self.hints:
                self.hints.publish("group", **group.to_json())
        if new:
            self._write_record()  # a group is on record before anything signals it
        elif changed:
            self._record_due = True  # usage figures alone: with the pass's other changes
        if new and self.phase is TERMINATING:
            self._signal_groups(new, signal.SIGTERM, signal.SIGCONT)
        elif new and self.phase is KILLING:
            self._signal_groups(new, signal.SIGKILL)

    def _begin_stop(self, reason: str) -> None:
        if self.phase is not RUNNING:
            return  # stopping already: the first reason stays
        self._change(STOP)
        self.reason = reason
        self._reap()
        self._scan()
        if self.exit is not None:
            self._note_leftovers()  # named before anything is signalled
        self._write_record()
        self._signal_groups(self._all_groups(), signal.SIGTERM, signal.SIGCONT)
        # Descendants left in the guard's own group are in no recorded group: tell them one by one.
        for proc in self.descendants.values():
            if proc.pgid == self.my_pgid and not proc.zombie:
                for sig in (signal.SIGTERM, signal.SIGCONT):
                    procs.signal_process(procs.Identity(proc.pid, proc.start), sig)
        self.deadline = self.clock() + self.opts.grace

    def _note_leftovers(self) -> None:
        """CMD has exited and the last scan is fresh: name what of its tree still runs, once."""
        if not self.leftovers_noted:
            self.leftovers_noted = True
            self.leftovers = leftovers.collect(self.descendants)

    def _kill_all(self) -> None:
        if self.opts.cgroup is not None:
            self._kill_cgroup()
        self._signal_groups(self._all_groups(), signal.SIGKILL)  # own group last
        for proc in self.descendants.values():
            if not proc.zombie:
                procs.signal_process(procs.Identity(proc.pid, proc.start), signal.SIGKILL)

    def _kill_cgroup(self) -> None:
        assert self.opts.cgroup is not None
        try:
            cgroup.kill(self.opts.cgroup)
        except OSError as e:
            self._cannot(str(e))

    def _all_groups(self) -> list[procs.Group]:
        """Every recorded group in the order seen, the own group last."""
        groups = list(self.groups)
        if self.own is not None:
            groups.append(self.own)
        return groups

    def _signal_groups(self, groups: list[procs.Group], *sigs: int) -> None:
        # Only a group still the same is signalled: a gone group's id may be reused. One judgement
        # for the whole round, then each such group gets each signal once, in the order given.
        same = procs.same_groups(groups)
        for group in groups:
            if group in same:
                self._signal_live_group(group, sigs)

    def _signal_live_group(self, group: procs.Group, sigs: tuple[int, ...]) -> None:
        for sig in sigs:
            try:
                procs.signal_group(group.pgid, sig)
            except PermissionError:
                self._cannot(f"unable to signal group {group.pgid}: permission denied")
                return

    def _cannot(self, note: str) -> None:
        """What the guard may not do (kept for the give-up reason), said on stderr."""
        if note not in self.eperm:
            self.eperm.append(note)
        _say(note)

    def _all_gone(self) -> bool:
        if self.has_children:
            return False
        if self.opts.cgroup is not None and cgroup.populated(self.opts.cgroup):
            return False  # the kernel's own word: something of the turn still runs
        return not procs.live_groups(self._all_groups())

    def _change(self, event: str) -> None:
        """The one place the phase changes (CHANGES); a change not there raises GuardFailure."""
        self.phase = next_phase(self.phase, event)

    def _finish(self) -> int:
        if self.logs is not None:
            self.logs.drain()  # what the last descendants wrote
        self._change(ALL_GONE)
        self._write_record(last=True)
        self._close_hints()
        self._close_channel()
        return self.exit.exit_code() if self.exit is not None else EXIT_GUARD_FAILURE

    def _give_up(self) -> int:
        live = procs.live_groups(self._all_groups())
        left = [g.pgid for g in self._all_groups() if g in live]
        why = "; ".join(self.eperm) or (f"still alive {_GIVE_UP_GRACES} graces after SIGKILL")
        self.reason = f"unkillable: groups {left}: {why}"
        _say(f"unable to end the work of turn {self.turn}: {self.reason}")
        if self.logs is not None:
            self.logs.drain()  # that line too
        self._write_record(last=True)  # state stays "stopping": the slot stays counted
        self._close_hints()
        self._close_channel()
        return EXIT_GUARD_FAILURE

    def _tell_exit(self) -> None:
        if self.hints is not None and self.exit is not None and not self.exit_told:
            self.exit_told = True
            self.hints.publish("exited", **self.exit.to_json())

    def _close_channel(self) -> None:
        for adopter in self._adopting.values():
            os.close(adopter)
        self._adopting.clear()
        if self.channel is not None:
            self.channel.close()
            self.channel = None

    def _close_hints(self) -> None:
        if self.hints is None:
            return
        if self.phase is GONE:
            self.hints.publish("gone", record=str(self.record_file) if self.record_file else None)
        self.hints.close()

    # --- the record ----------------------------------------------------------------------------

    def to_record(self) -> dict:
        data = {
            "v": 1,
            "guard": self.me.to_json(),
            "turn": self.turn,
            "argv": list(self.opts.argv),
            "cwd": self.cwd,
            "own_group": self.own.to_json() if self.own else None,
            "groups": [{**g.to_json(), "seen_at": seen} for g, seen in self.groups.items()],
            "state": _record_state(self.phase),
            "exit": self.exit.to_json() if self.exit else None,
            "exited_at": self.exited_at,
            "reason": self.reason,
            "started_at": self.started_at,
            "cgroup": self.opts.cgroup,
            "usage": self.usage.to_json(),
        }
        if self.logs is not None:
            data["truncated"] = self.logs.truncated
        if self.leftovers is not None:
            data["leftovers"] = self.leftovers
        if self.opts.adopt_within > 0:
            data["channel"] = (
                {"v": channel.CHANNEL_VERSION, "path": self.channel.path} if self.channel else None
            )
            data["adopt_within"] = self.opts.adopt_within
            data["waiting_since"] = self.waiting_since
            data["adopted_at"] = self.adopted_at
        return data

    def _write_record(self, last: bool = False) -> None:  # last: leave no spare (record.Rewriter)
        self._record_due = False
        if self.recorder is not None:
            try:
                # Not fsynced: only a power loss loses it, and then nothing it names still runs
                # (the slot record of an earlier boot is free: supervisor.slots.record's boot rule).
                self.recorder.write(self.to_record(), last=last)
            except OSError as e:
                # Containment matters more than the record: keep going, loudly.
                _say(f"unable to write record {self.record_file}: {e.strerror}")
        self._tell_exit()  # after the record that holds the exit: a reader of the hint finds it


def _cwd() -> str | None:
    try:
        return os.getcwd()
    except OSError:  # removed under us: the record says so by its absence
        return None


def _say(message: str) -> None:
    """One line on stderr that never raises: a supervisor killed outright leaves the guard's
    stderr a broken pipe, and the guard must still end the work."""
    try:
        print(f"ccsup-guard: {message}", file=sys.stderr)
    except (OSError, ValueError):
        pass


def _drain(fd: int) -> set[int]:
    sigs: set[int] = set()
    while True:
        try:
            data = os.read(fd, 512)
        except BlockingIOError:
            return sigs
        if not data:
            return sigs
        sigs.update(data)


def run_guard(opts: Options, parent_fd: int | None = None) -> int:
    """Run one turn under a guard; returns the guard's exit status (parent_fd: see Guard)."""
    guard = None
    try:
        guard = Guard(opts, parent_fd=parent_fd)
        return guard.run()
    except (GuardFailure, OSError) as e:  # GuardFailure: the operation and the reason
        _say(str(e))
        if guard is not None and guard.logs is not None and guard.logs.fds:
            guard.logs.drain()  # the line went into the guard's own stderr pipe
        if guard is not None:
            guard._close_channel()  # no socket left behind by a guard that failed to start
        return EXIT_GUARD_FAILURE
