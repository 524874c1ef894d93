"""Starting CMD: the fork, what the child does between fork and exec, and the report of a failure.

Design note.
- CMD is forked and exec'd rather than posix_spawn'd: glibc's posix_spawn leaves its two internal
  signals (32, 33) ignored in the child, and CMD must start with every disposition at default and
  an empty mask. subprocess.Popen is not used either: its wait would be a second reaper next to
  the guard's (see guardd.guard).
- CMD is born in the turn's cgroup (clone3 with CLONE_INTO_CGROUP, guardd.linux: a join after the
  fork cost 15-20 ms a turn); where the kernel cannot, it is a plain fork and the child joins the
  cgroup first thing. Either way nothing of CMD runs outside it. Between fork and exec the child,
  in this order: gives CMD back the soft RLIMIT_NOFILE the supervisor's caller had
  ($CCSUP_GUARD_NOFILE, never passed on to CMD), blocks every signal and sets every disposition to
  default, makes a group of its own, checks that the guard is still its parent, empties the mask
  and execs.
- With `tty` (the guard's `--tty`: its stdin is a pty's slave), CMD makes a session of its own
  instead of only a group (setsid, then TIOCSCTTY on fd 0), always on the fork path: the C clone
  makes a group, and the guard's own setpgid from outside would make the child a group leader,
  which setsid refuses. CMD's group is still its pid, the own group, so containment is unchanged.
- A failure comes back through a close-on-exec pipe, EOF meaning exec succeeded:
  `cgroup:<errno>` when the cgroup could not be joined (exit 125), `<errno>` when exec failed
  (127 not found, 126 found but not executable), `gone` when the watched process had ended
  (125). Both ends of that pipe are here: `start` reads it and gives an `ExecFailure` with the
  exit status and the reason the record states.
- Where guardd._spawn is built (guardd/_spawn.c), the fork is a clone that shares the guard's
  memory until exec, and the steps between are that module's, in C, in the same order; the fork
  here is the fallback.
- A guard that dies between fork and exec (before its record could name CMD's group): the child
  sees a parent that is not the guard and runs nothing. The check comes after the cgroup join, so a
  guard that dies after it leaves CMD where the supervisor looks (the cgroup, or CMD's CCSUP_TURN).
- A supervisor that dies before CMD runs: the last thing before exec, the child looks at the
  pidfd the guard watches (`watch`, the supervisor's) and runs nothing once that process has
  ended (`parent_gone`, exit 125). The supervisor names the turn's cgroup in its slot record before
  the guard starts, so this closes the window in which a restarted supervisor could see the slot
  free while CMD was about to run: either CMD was in the cgroup before the supervisor died (the
  slot reads orphaned while it runs), or it sees the supervisor dead and never runs.

Knows fork, exec, signal dispositions, the fd limit and the pipe's words. Knows nothing of reaping
(the guard is the one reaper: `start` never waits, its caller reaps a child that failed), of
records or of groups after the start. Stateless.
"""

from __future__ import annotations

import os
import resource  # here, not in the child: the zygote's import serves every guard
import select
import signal
import sys

from guardd import cgroup, linux
from guardd.exits import EXIT_GUARD_FAILURE, EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND

# os.fsencode's encoding, applied directly: os.fsencode is Python code, and CMD's environment
# (often 100 variables, two strings each) went through it at every start.
_FS = (sys.getfilesystemencoding(), sys.getfilesystemencodeerrors())

try:  # CMD's clone and exec in C (guardd/_spawn.c), where it was built (x86_64 Linux)
    from guardd import _spawn  # type: ignore[attr-defined]
except ImportError:
    _spawn = None

# The soft RLIMIT_NOFILE to give CMD back: the supervisor raises its own soft limit to the hard one
# (hundreds of turns need thousands of fds) and says here what it had, so that a turn's tools
# (select() breaks above 1024) start with what they would have had anyway. Never passed on to CMD.
NOFILE_ENV = "CCSUP_GUARD_NOFILE"

_CGROUP_FAILED = b"cgroup:"
_WATCHED_GONE = b"gone"


class ExecFailure:
    """CMD did not start: the guard's exit status, the record's reason, the line for stderr."""

    __slots__ = ("code", "reason", "message")

    def __init__(self, code: int, reason: str, message: str):
        self.code, self.reason, self.message = code, reason, message


def start(
    argv: list[str],
    env: dict[str, str],
    cgroup_path: str | None = None,
    *,
    watch: int | None,
    tty: bool = False,
) -> tuple[int, ExecFailure | None]:
    """Fork and exec CMD in a new group (and cgroup_path, when given); env is CMD's environment
    (NOFILE_ENV is taken out of it). watch: a pidfd on the process whose end ends the turn (the
    supervisor): CMD is exec'd only while it runs; None: it has ended already, nothing is forked
    (pid 0). tty: fd 0 is a terminal, which CMD takes as its controlling one in a session of its
    own (the fork path: setsid + TIOCSCTTY). Returns CMD's pid and, when it did not start, why:
    that child has then exited (or is about to) and is left for the caller to reap."""
    if watch is None:
        return 0, _watched_gone()
    nofile = _nofile_limit(env.pop(NOFILE_ENV, None))
    if tty:  # imported here, not in the child (see below)
        import fcntl  # noqa: F401
        import termios  # noqa: F401
    # Everything the child needs is worked out here, before the fork: each page the child writes
    # (Python's refcounts) is copied, so work done there costs several times more.
    paths = _candidates(argv[0], env)
    errr, errw = os.pipe()  # both close-on-exec: EOF on exec success
    guard_pid = os.getpid()
    pid = (
        None if tty else _spawn_in_c(paths, argv, env, errw, cgroup_path, watch, guard_pid, nofile)
    )
    if pid is None:  # not built here, or the kernel refused that clone: a fork, in Python
        to_default = _not_default()
        pid, join = _fork(cgroup_path)
        if pid == 0:
            _exec_child(paths, argv, env, errw, join, guard_pid, nofile, to_default, watch, tty)
    os.close(errw)
    if not tty:  # a tty child makes its session itself: setsid fails in a group's leader
        try:
            os.setpgid(pid, pid)  # both sides, as shells do: the group exists before we go on
        except OSError:
            pass  # EACCES: the child already exec'd (and set it); ESRCH: it already died
    err = b""
    while chunk := os.read(errr, 64):
        err += chunk
    os.close(errr)
    if not err:
        return pid, None
    if err == _WATCHED_GONE:
        return pid, _watched_gone()
    if err.startswith(_CGROUP_FAILED):
        errno_ = int(err[len(_CGROUP_FAILED) :])
        reason = f"unable to join cgroup {cgroup_path}: {os.strerror(errno_)}"
        return pid, ExecFailure(EXIT_GUARD_FAILURE, reason, reason)
    code, message = exec_error(argv[0], paths, int(err))
    what = "not_found" if code == EXIT_NOT_FOUND else "not_executable"
    return pid, ExecFailure(code, f"{what}: {message}", message)


def exec_error(name: str, paths: list[str], errno_: int) -> tuple[int, str]:
    """CMD's failed exec as a shell words it, and the status: 127 not found (`NAME: command not
    found`, or `PATH: No such file or directory` for a path, or `PATH: INTERPRETER: bad
    interpreter: No such file or directory` when the file is there and its #! line names a
    missing program), else 126 (`PATH: Permission denied`, `Is a directory`, `cannot execute
    binary file: Exec format error`)."""
    import errno as codes

    found = next((p for p in paths if os.path.isfile(p) or os.path.isdir(p)), None)
    if errno_ in (codes.ENOENT, codes.ENOTDIR):
        if found is not None and os.path.isfile(found):
            interpreter = _interpreter(found)
            if interpreter is not None:
                return EXIT_NOT_FOUND, (
                    f"{name}: {interpreter}: bad interpreter: {os.strerror(codes.ENOENT)}"
                )
        if os.sep not in name:
            return EXIT_NOT_FOUND, f"{name}: command not found"
        return EXIT_NOT_FOUND, f"{name}: {os.strerror(errno_)}"
    if errno_ == codes.EACCES and found is not None and os.path.isdir(found):
        return EXIT_NOT_EXECUTABLE, f"{name}: {os.strerror(codes.EISDIR)}"
    if errno_ == codes.ENOEXEC:
        return EXIT_NOT_EXECUTABLE, f"{name}: cannot execute binary file: {os.strerror(errno_)}"
    return EXIT_NOT_EXECUTABLE, f"{name}: {os.strerror(errno_)}"


def _interpreter(path: str) -> str | None:
    """The program a script's #! line names, or None (not a script, or unreadable)."""
    try:
        with open(path, "rb") as f:
            first = f.readline(256)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].split()
    return os.fsdecode(words[0]) if words else None


def _spawn_in_c(
    paths: list[str],
    argv: list[str],
    env: dict[str, str],
    errw: int,
    cgroup_path: str | None,
    watch: int,
    guard_pid: int,
    nofile: int | None,
) -> int | None:
    """CMD cloned and exec'd by guardd._spawn (the same steps as _exec_child, ~0.1 ms instead
    of 1.2-2 ms); None when that cannot be done here: the module is not built, an argument is not
    one exec takes (the fork path reports it as before), or clone3 refused (ENOSYS before Linux
    5.7 or under seccomp, or a cgroup it will not enter: the fork path joins it and says why)."""
    if _spawn is None or any("=" in name for name in env):
        return None
    fd = -1
    try:
        if cgroup_path is not None:
            fd = os.open(cgroup_path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        envp = [f"{name}={value}".encode(*_FS) for name, value in env.items()]
        return _spawn.spawn(
            [p.encode(*_FS) for p in paths],
            [a.encode(*_FS) for a in argv],
            envp,
            errw,
            fd,
            watch,
            guard_pid,
            -1 if nofile is None else nofile,
        )
    except (OSError, ValueError, UnicodeError):
        return None
    finally:
        if fd >= 0:
            os.close(fd)


def _watched_gone() -> ExecFailure:
    message = "the supervisor is gone: CMD was not run"
    return ExecFailure(EXIT_GUARD_FAILURE, "parent_gone", message)


def _fork(cgroup_path: str | None) -> tuple[int, str | None]:
    """fork(), the child born in cgroup_path when the kernel can (linux.fork_into_cgroup); else a
    plain fork and the cgroup the child must join itself (returned), with the same errors."""
    if cgroup_path is None:
        return os.fork(), None
    try:
        fd = os.open(cgroup_path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return os.fork(), cgroup_path  # the join says why, as below
    try:
        return linux.fork_into_cgroup(fd), None
    except OSError:
        # ENOSYS (before Linux 5.7, or clone3 filtered by seccomp) or a cgroup the kernel will not
        # take: a plain fork, and the child's join runs the same checks and reports the same error.
        return os.fork(), cgroup_path
    finally:
        os.close(fd)  # in the child too: close-on-exec would do it, this is earlier


def _candidates(name: str, env: dict[str, str]) -> list[str]:
    """The paths CMD's exec tries, in order: os.execvpe's search of env's PATH (os.defpath when
    it has none; an empty entry is the working directory), or name itself when it has a slash."""
    if os.sep in name:
        return [name]
    return [os.path.join(d, name) for d in env.get("PATH", os.defpath).split(os.pathsep)]


def _not_default() -> list[signal.Signals]:
    """The signals whose disposition is not the default here (the guard's handlers, what Python or
    our parent ignores, and what Python cannot tell): the child sets these back to default, one
    call each, instead of every signal."""
    keep = (signal.SIGKILL, signal.SIGSTOP)
    return [
        sig
        for sig in signal.valid_signals()
        if sig not in keep and signal.getsignal(sig) != signal.SIG_DFL
    ]


def _nofile_limit(value: str | None) -> int | None:
    """The soft RLIMIT_NOFILE CMD gets back ($CCSUP_GUARD_NOFILE); None: leave it as inherited."""
    if value is None or not value.isdigit():
        return None
    return int(value)


def _exec_child(
    paths: list[str],
    argv: list[str],
    env: dict,
    errw: int,
    cgroup_path: str | None,
    guard_pid: int,
    nofile: int | None,
    to_default: list[signal.Signals],
    watch: int,
    tty: bool = False,
) -> None:
    """In the forked child (never returns): the turn's cgroup (when not born in it), a new group,
    default dispositions, empty mask, the soft fd limit the supervisor's caller had (nofile), then
    exec CMD (the first of paths that execs, as os.execvpe) if the watched process still runs."""
    if cgroup_path is not None:
        try:
            cgroup.join(cgroup_path)
        except OSError as e:
            try:
                os.write(errw, _CGROUP_FAILED + str(e.errno or 0).encode())
            finally:
                os._exit(EXIT_GUARD_FAILURE)
    try:
        if nofile is not None:
            _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            if hard == resource.RLIM_INFINITY or nofile <= hard:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, hard))
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        signal.set_wakeup_fd(-1)
        for sig in to_default:
            try:
                signal.signal(sig, signal.SIG_DFL)
            except (OSError, ValueError):
                pass  # glibc's own signals cannot be set; the kernel resets handlers at exec
        if tty:
            # Its own session (pgid = its pid, the own group as without a tty) with the pty as its
            # controlling terminal: ^C and ^Z then reach its foreground group, and its end hangs
            # up the terminal's groups. The guard is in another session, so none of it reaches it.
            os.setsid()
            _take_terminal(0)
        else:
            os.setpgid(0, 0)
        if guard_pid and os.getppid() != guard_pid:
            # The guard died before CMD ran (before its record could name CMD's group): run
            # nothing. Checked after joining the cgroup, so a guard that dies after this check
            # leaves CMD where the supervisor looks (the cgroup, or CMD's CCSUP_TURN marker).
            os._exit(EXIT_GUARD_FAILURE)
        if select.select([watch], [], [], 0)[0]:  # a pidfd reads ready once its process ended
            os.write(errw, _WATCHED_GONE)
            os._exit(EXIT_GUARD_FAILURE)
        signal.pthread_sigmask(signal.SIG_SETMASK, ())
        _exec_first(paths, argv, env)
    except OSError as e:
        try:
            os.write(errw, str(e.errno or 0).encode())
        finally:
            os._exit(EXIT_NOT_FOUND)
    except BaseException:  # noqa: BLE001 -- the forked child must never return into the guard
        os._exit(EXIT_GUARD_FAILURE)


def _take_terminal(fd: int) -> None:
    """Make the terminal on fd the calling session leader's controlling terminal (TIOCSCTTY)."""
    import fcntl
    import termios

    fcntl.ioctl(fd, termios.TIOCSCTTY, 0)


def _exec_first(paths: list[str], argv: list[str], env: dict) -> None:
    """os.execvpe's loop over paths already searched: returns never; raises the first error that
    is not "no such file" (EACCES of a non-executable match), else the last."""
    first: OSError | None = None
    last: OSError | None = None
    for path in paths:
        try:
            os.execve(path, argv, env)
        except (FileNotFoundError, NotADirectoryError) as e:
            last = e
        except OSError as e:
            last = e
            first = first or e
    raise first or last or FileNotFoundError(2, "no PATH to search")
