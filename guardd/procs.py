"""Process identity, group liveness and signalling: the one implementation guard and supervisor share.

Design note. A pid alone names nothing for long: pid_max can be 32768, so ids come round. A process
is therefore its pid *and* its start time, field 22 of /proc/<pid>/stat in clock ticks since boot,
read as an integer. A process group is its pgid and its leader's start (None when the leader had
already exited when the group was first seen).

A recorded group is alive when some process that is not a zombie still has that pgid and it is the
same group. The kernel does not hand out a pid that is in use as a pgid, so if a process with
pid == pgid exists and its start differs from the recorded leader's (or no leader was recorded), the
recorded group has emptied and the id belongs to someone else: gone. A zombie counts as gone: it runs
nothing and holds nothing but its id. (`killpg(pgid, 0)` succeeds while only zombies remain, so it
can only ever prove a group gone, never alive.)

Single processes are signalled through a pidfd opened *before* the identity check, so the check
and the signal are about the same process. Groups are signalled with killpg; the caller keeps the
id pinned (by being the subreaper that has not yet reaped a member, or by knowing it alive).

Every reader of /proc in ccsup is here: a process's stat (one parser, for the guard's scan too),
its environment, the flocks held (/proc/locks, and a process's own fdinfo) and the memory
available (/proc/meminfo). Knows /proc and signals; nothing of records, slots or the bus.
Standard library only.
"""

from __future__ import annotations

import errno
import os

_GONE_ERRNOS = (errno.ENOENT, errno.ESRCH)


class _Value:
    """An immutable record compared and hashed by value, like a frozen dataclass.

    Plain slots rather than `dataclasses`: importing dataclasses (through inspect) cost the guard
    9-13 ms of every start. Subclasses name their fields in `__slots__`, in order.
    """

    __slots__: tuple[str, ...] = ()

    def __init__(self, *args: object, **kwargs: object) -> None:
        names = self.__slots__
        if len(args) > len(names):
            raise TypeError(
                f"{type(self).__name__}() takes {len(names)} arguments, got {len(args)}"
            )
        values = dict(zip(names, args, strict=False))
        for name, value in kwargs.items():
            if name not in names:
                raise TypeError(f"{type(self).__name__}() got an unexpected argument {name!r}")
            if name in values:
                raise TypeError(f"{type(self).__name__}() got multiple values for {name!r}")
            values[name] = value
        missing = [n for n in names if n not in values]
        if missing:
            raise TypeError(f"{type(self).__name__}() missing arguments: {', '.join(missing)}")
        for name in names:
            object.__setattr__(self, name, values[name])

    def _values(self) -> tuple:
        return tuple(getattr(self, n) for n in self.__slots__)

    def __setattr__(self, name, value):
        raise AttributeError(f"cannot assign to field {name!r}: {type(self).__name__} is immutable")

    def __delattr__(self, name):
        raise AttributeError(f"cannot delete field {name!r}: {type(self).__name__} is immutable")

    def __eq__(self, other):
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self):
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__)
        return f"{type(self).__name__}({fields})"

    def __reduce__(self):
        return (type(self), self._values())


class Stat(_Value):
    """The fields of /proc/<pid>/stat that ccsup uses: pid, state, ppid, pgid, sid, threads
    (field 20) and start (field 22: clock ticks since boot)."""

    __slots__ = ("pid", "state", "ppid", "pgid", "sid", "threads", "start")
    __match_args__ = ("pid", "state", "ppid", "pgid", "sid", "threads", "start")
    pid: int
    state: str
    ppid: int
    pgid: int
    sid: int
    threads: int
    start: int

    def __init__(
        self, pid: int, state: str, ppid: int, pgid: int, sid: int, threads: int, start: int
    ):
        # Positional and direct: the guard's scan builds one per descendant at every scan.
        setattr_ = object.__setattr__
        setattr_(self, "pid", pid)
        setattr_(self, "state", state)
        setattr_(self, "ppid", ppid)
        setattr_(self, "pgid", pgid)
        setattr_(self, "sid", sid)
        setattr_(self, "threads", threads)
        setattr_(self, "start", start)

    @property
    def zombie(self) -> bool:
        return self.state in ("Z", "X", "x")


class Identity(_Value):
    """One process: pid plus start ticks."""

    __slots__ = ("pid", "start")
    __match_args__ = ("pid", "start")
    pid: int
    start: int

    def to_json(self) -> dict:
        return {"pid": self.pid, "start": self.start}

    @classmethod
    def from_json(cls, data: dict) -> Identity:
        return cls(int(data["pid"]), int(data["start"]))


class Group(_Value):
    """One process group: pgid plus the leader's start ticks (None: leader gone when first seen)."""

    __slots__ = ("pgid", "leader_start")
    __match_args__ = ("pgid", "leader_start")
    pgid: int
    leader_start: int | None

    def to_json(self) -> dict:
        return {"pgid": self.pgid, "leader_start": self.leader_start}

    @classmethod
    def from_json(cls, data: dict) -> Group:
        start = data.get("leader_start")
        return cls(int(data["pgid"]), None if start is None else int(start))


def parse_stat(pid: int, data: bytes) -> Stat:
    """The text of /proc/<pid>/stat, parsed. The one parser of it in ccsup."""
    # The command name (field 2) is in parentheses and may itself hold ')' or spaces.
    fields = data[data.rindex(b")") + 2 :].split(maxsplit=20)
    # fields[0] is field 3 of proc(5), so field N is fields[N - 3].
    return Stat(
        pid,
        fields[0].decode(),
        int(fields[1]),
        int(fields[2]),
        int(fields[3]),
        int(fields[17]),
        int(fields[19]),
    )


def read_stat(pid: int) -> Stat | None:
    """The process's stat, or None when there is no such process (reaped or never was)."""
    try:
        # os.open and one read: a file object costs three more syscalls (fstat, ioctl, lseek) and
        # this runs for every process a scan or a judgement looks at. One read returns it whole.
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        try:
            data = os.read(fd, 4096)
        finally:
            os.close(fd)
    except OSError as e:
        if e.errno in _GONE_ERRNOS:
            return None
        raise
    if not data:
        return None
    return parse_stat(pid, data)


def start_ticks(pid: int) -> int | None:
    stat = read_stat(pid)
    return None if stat is None else stat.start


def identity_of(pid: int) -> Identity | None:
    """The identity of the process that has this pid now, or None."""
    stat = read_stat(pid)
    return None if stat is None else Identity(pid, stat.start)


def all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def snapshot() -> dict[int, Stat]:
    """One pass over /proc: every process's stat by pid."""
    stats = {}
    for pid in all_pids():
        try:
            stat = read_stat(pid)
        except OSError:
            continue
        if stat is not None:
            stats[pid] = stat
    return stats


def read_small(path: str, size: int = 256) -> bytes | None:
    """Up to `size` bytes of a small /proc file in one read; None when it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, size)
    except OSError:
        return None
    finally:
        os.close(fd)


def command_of(pid: int, args: int = 3) -> tuple[str, list[str]] | None:
    """The process's command name (`comm`) and the first `args` of its argv (an empty list for
    a process whose argv is gone, such as a zombie); None when it is gone or unreadable."""
    comm = read_small(f"/proc/{pid}/comm", 64)
    if comm is None:
        return None
    cmdline = read_small(f"/proc/{pid}/cmdline", 4096) or b""
    argv = [a.decode(errors="replace") for a in cmdline.split(b"\0")[:args] if a]
    return comm.rstrip(b"\n").decode(errors="replace"), argv


def uptime() -> float:
    """Seconds since boot, the clock of start ticks (/proc/uptime); OSError when unreadable."""
    with open("/proc/uptime", "rb") as f:
        return float(f.read().split()[0])


def _runs_anything(stat: Stat) -> bool:
    """A zombie thread-group leader may still have live threads; only then does it run anything."""
    if not stat.zombie:
        return True
    try:
        tids = os.listdir(f"/proc/{stat.pid}/task")
    except OSError:
        return False
    for tid in tids:
        try:
            with open(f"/proc/{stat.pid}/task/{tid}/stat", "rb") as f:
                if not parse_stat(int(tid), f.read()).zombie:
                    return True
        except (OSError, ValueError, IndexError):
            continue
    return False


def process_running(ident: Identity) -> bool:
    """True when that very process exists and is not a zombie."""
    stat = read_stat(ident.pid)
    return stat is not None and stat.start == ident.start and _runs_anything(stat)


def process_exists(ident: Identity) -> bool:
    """True when that very process exists, zombie or not (its pid is still pinned)."""
    stat = read_stat(ident.pid)
    return stat is not None and stat.start == ident.start


def _id_taken_by_another(group: Group, leader: Stat | None) -> bool:
    return leader is not None and leader.start != group.leader_start


def group_alive(group: Group, procs: dict[int, Stat] | None = None) -> bool:
    """Is the recorded group still running anything? See the module's design note.

    `procs` is an optional snapshot() to judge many groups with one pass over /proc.
    """
    if procs is None:
        if not has_members(group.pgid):
            return False
        leader = read_stat(group.pgid)
    else:
        leader = procs.get(group.pgid)
    if _id_taken_by_another(group, leader):
        return False
    if leader is not None and leader.pgid == group.pgid and _runs_anything(leader):
        return True
    if procs is None:
        procs = snapshot()
    return any(s.pgid == group.pgid and _runs_anything(s) for s in procs.values())


def has_members(pgid: int) -> bool:
    """Does the group have any member at all, zombies included? One killpg(pgid, 0); a group
    whose members belong to another user has members (look closer to judge them)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def memberless(groups) -> bool:
    """True when no group has a member at all, zombies included (a killpg(pgid, 0) each)."""
    # pgid <= 0 is not a group (see live_groups)
    return not any(has_members(g.pgid) for g in groups if g.pgid > 0)


def live_groups(groups, procs: dict[int, Stat] | None = None) -> set[Group]:
    """The groups among `groups` still running anything, judged together: cost in processes.

    group_alive() of a leaderless group walks /proc, so judging N groups one by one costs
    N x processes (10 s for 800 groups of a 1,200-process turn). Here a killpg(pgid, 0) per group
    drops those with no member at all (no /proc read), a group whose leader runs is judged by its
    leader's stat alone (as group_alive does), and only the rest are judged with one pass over
    /proc (or the given snapshot): each group by the same rule as group_alive. (The pass costs
    every process on the machine: 500 guards stopping at once, each passing over the 1,000
    processes of them and their turns, cost 40-60 ms of CPU a guard.)
    """
    candidates = []
    alive: set[Group] = set()
    for group in dict.fromkeys(groups):
        if group.pgid <= 0:
            continue  # not a group: a process being reaped shows pgid -1 in /proc/<pid>/stat
        if procs is None:
            if not has_members(group.pgid):
                continue
            leader = read_stat(group.pgid)
            if _id_taken_by_another(group, leader):
                continue
            if leader is not None and leader.pgid == group.pgid and _runs_anything(leader):
                alive.add(group)
                continue
        candidates.append(group)
    if not candidates:
        return alive
    if procs is None:
        procs = snapshot()
    wanted = {g.pgid for g in candidates}
    running: set[int] = set()
    for stat in procs.values():
        if stat.pgid in wanted and stat.pgid not in running and _runs_anything(stat):
            running.add(stat.pgid)
    return alive | {
        g
        for g in candidates
        if g.pgid in running and not _id_taken_by_another(g, procs.get(g.pgid))
    }


def same_groups(groups) -> set[Group]:
    """The groups among `groups` that are still the same groups: some member left, zombies
    included, and the id not another's. What may be signalled: a group of zombies only ignores
    the signal, and its zombies keep its id from being given to anyone else.

    A killpg(pgid, 0) and the leader's stat a group, never a pass over /proc (live_groups makes
    one for a group whose leader is a zombie: a guard's SIGKILL round, taken every poll while the
    turn's last processes die, made that pass hundreds of times at once with 500 turns stopping).
    A group whose members belong to another user is judged by live_groups.
    """
    same: set[Group] = set()
    unsure = []
    for group in dict.fromkeys(groups):
        if group.pgid <= 0:
            continue  # not a group (see live_groups)
        try:
            os.killpg(group.pgid, 0)
        except ProcessLookupError:
            continue  # no member at all, zombies included
        except PermissionError:
            unsure.append(group)  # signalling it fails: only when it runs something, as before
            continue
        if not _id_taken_by_another(group, read_stat(group.pgid)):
            same.add(group)
    return same | live_groups(unsure) if unsure else same


def signal_process(ident: Identity, sig: int) -> bool:
    """Send sig to exactly that process. False when it is gone or its pid is another's now."""
    try:
        fd = os.pidfd_open(ident.pid)
    except ProcessLookupError:
        return False
    try:
        # The pidfd pins the process: if the start matches now, the signal reaches this one.
        if start_ticks(ident.pid) != ident.start:
            return False
        import signal  # here: `ccsup ps` reads /proc through this module and sends no signal

        signal.pidfd_send_signal(fd, sig)
        return True
    except ProcessLookupError:
        return False
    finally:
        os.close(fd)


def signal_group(pgid: int, sig: int) -> bool:
    """killpg, False when the group has no member. PermissionError is the caller's to handle."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False


def environ_has(pid: int, name: str, value: str, *more: tuple[str, str]) -> bool:
    """Does the process's initial environment hold name=value (and each of `more`)? False when
    unreadable or gone."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read()
    except OSError:
        return False
    entries = set(data.split(b"\0"))
    return all(f"{n}={v}".encode() in entries for n, v in ((name, value), *more))


def processes_with_env(
    name: str,
    value: str,
    procs: dict[int, Stat] | None = None,
    *,
    also: dict[str, str] | None = None,
) -> list[Identity]:
    """Live processes whose environment carries name=value (and every pair of `also`): escapees
    found by their marker."""
    if procs is None:
        procs = snapshot()
    own = os.getpid()
    more = tuple((also or {}).items())
    return [
        Identity(s.pid, s.start)
        for s in procs.values()
        if s.pid != own and not s.zombie and environ_has(s.pid, name, value, *more)
    ]


# -- locks and memory ------------------------------------------------------------------------------


def file_key(st: os.stat_result) -> tuple[int, int, int]:
    """A file's (major, minor, inode), the way /proc/locks and fdinfo name it."""
    return os.major(st.st_dev), os.minor(st.st_dev), st.st_ino


def held_locks() -> set[tuple[int, int, int]]:
    """(major, minor, inode) of every file with a granted flock, from /proc/locks, in one read.

    OSError when /proc/locks cannot be read. The first read in a process waits for the kernel's
    file-lock semaphore (an RCU grace period, about 10 ms): callers that ask about one lock whose
    holder they know try `holds_flock` first.
    """
    with open("/proc/locks", "rb") as f:
        data = f.read()
    held = set()
    for line in data.splitlines():
        # "1: FLOCK  ADVISORY  WRITE 3236 fe:00:2146412 0 EOF"; a blocked waiter has "->" second.
        parts = line.split()
        if len(parts) < 6 or parts[1] != b"FLOCK":
            continue
        major, minor, inode = parts[5].split(b":")
        held.add((int(major, 16), int(minor, 16), int(inode)))
    return held


def holds_flock(pid: int, st: os.stat_result) -> bool:
    """Whether process pid holds a flock on the file `st` describes, by its fdinfo.

    False when that cannot be shown (a process gone or not ours, no such lock): not a "no", only
    "ask /proc/locks".
    """
    fd_dir = f"/proc/{pid}/fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return False
    for name in names:
        try:
            target = os.stat(f"{fd_dir}/{name}")
            if (target.st_dev, target.st_ino) != (st.st_dev, st.st_ino):
                continue
            with open(f"/proc/{pid}/fdinfo/{name}", "rb") as f:
                info = f.read()
        except OSError:
            continue
        # "lock:\t1: FLOCK  ADVISORY  WRITE 1234 fe:00:5678 0 EOF", for locks held through this fd
        if any(
            line.startswith(b"lock:") and b" FLOCK " in line and b"->" not in line
            for line in info.splitlines()
        ):
            return True
    return False


def available_memory() -> int:
    """MemAvailable from /proc/meminfo, in bytes; OSError when it cannot be read."""
    with open("/proc/meminfo", "rb") as f:
        for line in f:
            if line.startswith(b"MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise OSError(
        errno.ENOENT, "unable to read available memory: /proc/meminfo has no MemAvailable"
    )
