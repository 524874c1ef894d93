"""The guard zygote: guards forked warm, in their own session, with nothing inherited, their
statuses reported exactly; and when the zygote is gone, guards are started directly until a new
zygote is started, later each time while they fail."""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from conftest import MARKER, PYTHON, ROOT, story, wait_until, zygote_of

from guardd import procs
from guardd.zygote_handle import Zygote, ZygoteGone
from supervisor.guards import handle as spawn
from supervisor.guards.handle import GuardSpec
from supervisor.guards.launcher import Launcher, PendingGuard

READY_THEN_READ = ["sh", "-c", "echo ready; read line; exit 7"]


def fd_targets(pid: int) -> dict[int, str]:
    targets = {}
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            targets[int(name)] = os.readlink(f"/proc/{pid}/fd/{name}")
        except FileNotFoundError:
            pass  # closed while we looked
    return targets


def pidfd_target(pid: int, fd: int) -> int:
    for line in Path(f"/proc/{pid}/fdinfo/{fd}").read_text().splitlines():
        if line.startswith("Pid:"):
            return int(line.split()[1])
    raise AssertionError(f"fd {fd} of {pid} is not a pidfd")


def wait_ready(log, turn_id: str) -> None:
    wait_until(
        lambda: any(b["data"] == "ready\n" for b in log.find(f"turn.{turn_id}.stdout")),
        what=f"{turn_id} to say ready",
    )


async def started(guard):
    """The GuardProcess a launcher's start_guard gave, or, pipelined, settled with later."""
    if not isinstance(guard, PendingGuard):
        return guard
    future = asyncio.get_running_loop().create_future()
    guard.then(future.set_result)
    result = await asyncio.wait_for(future, 10)
    if isinstance(result, OSError):
        raise result
    return result


# -- through a real daemon -------------------------------------------------------------------------


def test_a_forked_guard_has_its_own_session_and_inherits_no_fd(daemon, event_log, state_dir):
    d = daemon(caps="codex = 2", scan="30s")  # no rescans: the guard opens nothing while we look
    log = event_log(d)
    zygote = zygote_of(d.proc.pid)
    with d.client() as client:
        for n in range(2):  # two at once: neither may hold the other's pipes
            client.turn("codex", ["sh", "-c", "echo ready; exec sleep 30"], id=f"t{n}")
        for n in range(2):
            wait_ready(log, f"t{n}")
        guards = [log.wait_for(f"turn.t{n}.started")["guard"]["pid"] for n in range(2)]
        for guard in guards:  # the record is written (its temporary file closed) before we look
            wait_until(
                lambda guard=guard: (
                    (state_dir / "guards").exists()
                    and any(
                        p.name.startswith(f"{guard}-") and p.suffix == ".json"
                        for p in (state_dir / "guards").iterdir()
                    )
                ),
                what="the guard's record",
            )
        held_elsewhere = set(fd_targets(d.proc.pid).values()) | set(fd_targets(zygote).values())
        assert any(t.endswith(".lock") for t in held_elsewhere)  # the daemon holds slot locks
        for n, guard in enumerate(guards):
            stat = procs.read_stat(guard)
            assert (stat.ppid, stat.sid, stat.pgid) == (zygote, guard, guard)
            targets = fd_targets(guard)
            assert targets[0] in held_elsewhere  # the turn's stdin pipe
            # stdout and stderr: the guard's own pipes, whose read ends it holds (guardd.output)
            for fd in (1, 2):
                assert targets[fd].startswith("pipe:") and targets[fd] not in held_elsewhere
            logs = str(state_dir / "turns" / f"t{n}") + "/"
            pidfds = [fd for fd, t in targets.items() if t == "anon_inode:[pidfd]"]
            assert [pidfd_target(guard, fd) for fd in pidfds] == [
                d.proc.pid
            ]  # it watches the daemon
            strays = {
                fd: t
                for fd, t in targets.items()
                if fd > 2
                and fd not in pidfds
                and not (
                    t.startswith("/proc/")  # the scanner's files
                    or t.endswith("/cgroup.events")  # its turn's cgroup, watched
                    or t.startswith(logs)  # its turn's logs, which it writes
                    or (t.startswith(("pipe:", "socket:")) and t not in held_elsewhere)
                )
            }  # its own
            assert strays == {}
        for n in range(2):
            client.cancel(f"t{n}")
        for n in range(2):
            assert log.wait_for(f"turn.t{n}.exited")["code"] == 128 + signal.SIGTERM


def test_when_the_zygote_dies_running_turns_go_on_and_a_new_zygote_forks_the_next(
    daemon, event_log
):
    d = daemon(caps="codex = 2")
    log = event_log(d)
    zygote = zygote_of(d.proc.pid)
    with d.client() as client:
        client.turn("codex", READY_THEN_READ, id="before")
        wait_ready(log, "before")
        os.kill(zygote, signal.SIGKILL)
        wait_until(
            lambda: (
                "guard zygote" in d.stderr_path.read_text()
                and "is gone" in d.stderr_path.read_text()
            ),
            what="the daemon to log the zygote's end",
        )
        wait_until(lambda: procs.read_stat(zygote) is None, what="the zygote reaped by the daemon")
        # The turn it forked runs on (its guard watches the daemon) and its outcome comes from
        # its record: the zygote that would have reported the status is gone.
        client.send("before", "x\n", eof=True)
        assert story(log.wait_for("turn.before.exited")) == {
            "v": 1,
            "id": "before",
            "key": "codex",
            "code": 7,
            "signal": None,
            "reason": None,
        }
        log.wait_for("turn.before.released")

        # A new zygote is started (after 1 s: the lost one had been ready) and forks the next.
        wait_until(
            lambda: "guard zygote started" in d.stderr_path.read_text().split("is gone")[-1],
            what="a new zygote",
        )
        again = zygote_of(d.proc.pid)
        assert again != zygote
        client.turn("codex", READY_THEN_READ, id="after")
        wait_ready(log, "after")
        guard = log.wait_for("turn.after.started")["guard"]["pid"]
        stat = procs.read_stat(guard)
        assert (stat.ppid, stat.sid) == (again, guard)  # forked, in a session of its own
        client.send("after", "x\n", eof=True)
        assert log.wait_for("turn.after.exited")["code"] == 7
        log.wait_for("turn.after.released")


def test_a_guard_killed_outright_under_the_zygote_is_lost(daemon, event_log):
    d = daemon(caps="codex = 1", grace="300ms")
    log = event_log(d)
    with d.client() as client:
        client.turn("codex", ["sh", "-c", "echo ready; exec sleep 30"], id="k")
        wait_ready(log, "k")
        guard = log.wait_for("turn.k.started")["guard"]
        procs.signal_process(procs.Identity(guard["pid"], guard["start"]), signal.SIGKILL)
        assert story(log.wait_for("turn.k.exited")) == {
            "v": 1,
            "id": "k",
            "key": "codex",
            "code": None,
            "signal": None,
            "reason": "guard_lost",
        }
        log.wait_for("turn.k.released", timeout=10)


# -- the zygote on its own -------------------------------------------------------------------------


def spawn_and_wait(
    zygote: Zygote, argv: list[str], cwd: str | None = None, env: dict | None = None
) -> tuple[int, int, bytes]:
    """Spawn a guard for argv with stdin closed; returns (pid, returncode, its stderr)."""
    stdin_r, stdin_w = os.pipe()
    err_r, err_w = os.pipe()
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        spawned = zygote.spawn(
            ["--grace", "0.2", "--", *argv],
            cwd=cwd,
            env=dict(os.environ) if env is None else env,
            stdio=(stdin_r, null, err_w),
        )
    finally:
        for fd in (stdin_r, null, err_w):
            os.close(fd)
    os.close(stdin_w)
    os.close(spawned.pidfd)
    with os.fdopen(err_r, "rb") as f:
        err = f.read()  # EOF: the guard and CMD have ended
    deadline = time.monotonic() + 10
    while True:
        for pid, code in zygote.poll_reports():
            assert pid == spawned.pid
            return pid, code, err
        assert zygote.alive
        assert time.monotonic() < deadline, "no report from the zygote"
        select.select([zygote.fileno()], [], [], 1)


@pytest.fixture
def zygote():
    z = Zygote.start()
    yield z
    z.close()


def spares_of(zygote) -> list[int]:
    """The zygote's children that wait as spares (titled so), oldest first. A child that ends
    while it is looked at (reading its cmdline then fails with ESRCH) is not a spare."""
    found = []
    for child in Path(f"/proc/{zygote.pid}/task/{zygote.pid}/children").read_text().split():
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        start = procs.start_ticks(int(child))
        if cmdline.startswith(b"ccsup-guard (spare)") and start is not None:
            found.append((start, int(child)))
    return [pid for _, pid in sorted(found)]


def test_an_idle_zygote_keeps_spares_and_hands_a_request_to_the_oldest(zygote):
    """Idle, the zygote forks SPARES children ahead; a request goes to the oldest (the guard is
    that very process), the spare is replaced once the zygote is idle again, and a spare killed
    while it waits is replaced too: a request handed to it as it dies goes to the next one (the
    race is hit in about one round of five here; twenty rounds)."""
    from guardd.zygote import SPARES

    first = wait_until(
        lambda: len(spares_of(zygote)) == SPARES and spares_of(zygote), what="spares"
    )
    pid, code, _ = spawn_and_wait(zygote, ["sh", "-c", "exit 5"])
    assert (pid, code) == (first[0], 5)
    again = wait_until(lambda: len(spares_of(zygote)) == SPARES and spares_of(zygote), what="more")
    assert again[0] == first[1] and first[0] not in again
    for _ in range(20):  # killed just before a request: the zygote may hand it to the dying one
        waiting = wait_until(lambda: len(spares_of(zygote)) == SPARES and spares_of(zygote))
        os.kill(waiting[0], signal.SIGKILL)
        assert spawn_and_wait(zygote, ["sh", "-c", "exit 6"])[1] == 6  # the next spare, or a fork
        assert zygote.alive


# A zygote whose forks are counted (a line each in LOG) and refused while FAIL exists.
FORK_COUNTED = """
import errno, os, sys
sys.path.insert(0, {root!r})
real_fork = os.fork
def fork():
    with open({log!r}, "a") as f:
        f.write("fork\\n")
    if os.path.exists({fail!r}):
        raise OSError(errno.EAGAIN, "refused by the test")
    return real_fork()
os.fork = fork
from guardd.zygote import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_spare_that_cannot_be_forked_is_not_tried_again_until_the_next_request(tmp_path):
    """Out of processes, the zygote does not retry its spares' fork every few milliseconds: one
    failure, then no try until a request comes; the request is served once forks succeed again,
    and the spares come back."""
    import socket

    log, fail = tmp_path / "forks", tmp_path / "fail"
    script = FORK_COUNTED.format(root=str(ROOT), log=str(log), fail=str(fail))
    ours, theirs = socket.socketpair()
    proc = subprocess.Popen(
        [PYTHON, "-I", "-S", "-c", script, "--fd", str(theirs.fileno())],
        pass_fds=[theirs.fileno()],
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    theirs.close()
    ours.setblocking(False)
    z = Zygote(proc, ours)
    try:
        assert z._await_reply(time.monotonic() + 10)[0] == "ready"
        spares = wait_until(lambda: len(spares_of(z)) == 2 and spares_of(z), what="spares")
        fail.touch()
        for pid in spares:
            os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not spares_of(z), what="the spares reaped")
        forks = len(log.read_text().split())
        time.sleep(0.5)  # a hundred tries, were it retrying every 5 ms
        assert len(log.read_text().split()) - forks <= 2
        fail.unlink()
        assert spawn_and_wait(z, ["sh", "-c", "exit 7"])[1] == 7
        wait_until(lambda: len(spares_of(z)) == 2, what="the spares back")
    finally:
        z.close()


def test_a_zygote_that_ends_ends_and_reaps_its_spares(tmp_path):
    z = Zygote.start()
    spares = [procs.identity_of(pid) for pid in wait_until(lambda: spares_of(z), what="spares")]
    z.close()
    assert z.proc.wait(5) == 0
    assert not any(procs.process_running(s) for s in spares if s is not None)
    for spare in spares:  # reaped by the zygote itself: not even a zombie left for init
        assert spare is None or procs.read_stat(spare.pid) is None


def test_statuses_come_back_exactly(zygote):
    assert spawn_and_wait(zygote, ["sh", "-c", "exit 3"])[1] == 3
    assert spawn_and_wait(zygote, ["sh", "-c", "kill -9 $$"])[1] == 128 + 9
    _, code, err = spawn_and_wait(zygote, ["no-such-command-here"])
    assert (code, err) == (
        127,
        b"ccsup-guard: no-such-command-here: command not found\n",
    )
    assert (
        spawn_and_wait(zygote, [PYTHON, "-c", "import os; os.kill(os.getppid(), 9)"])[1] == -9
    )  # the guard


def test_a_forked_guard_imports_nothing_and_the_zygote_no_threading(tmp_path):
    """A module a guard imports after the fork is its own memory, and `threading` imported in
    the zygote runs its at-fork hook in every fork: the zygote's warm imports hold all that a
    guard with hints, a record and a reaped CMD imports, and no threading."""
    code = textwrap.dedent(
        f"""
        import sys
        from guardd import zygote
        zygote.warm()
        before = set(sys.modules)
        from guardd.__main__ import main
        rc = main(["--record-dir", {str(tmp_path)!r}, "--bus", "ipc://{tmp_path}/absent",
                   "--grace", "0.1", "--scan", "0.01", "--", "sh", "-c", "sleep 0.1; exit 3"])
        assert rc == 3, rc
        assert set(sys.modules) == before, sorted(set(sys.modules) - before)
        assert "threading" not in sys.modules
        """
    )
    run = subprocess.run(
        [PYTHON, "-I", "-S", "-c", f"import sys; sys.path.append({str(ROOT)!r})\n{code}"],
        capture_output=True,
        timeout=30,
    )
    assert run.returncode == 0, run.stderr.decode()


def test_a_forked_guard_runs_with_the_request_environment_not_the_zygotes(zygote, tmp_path):
    """The environment reaches the forked guard as a dict (os.environ stays the zygote's): CMD
    sees the request's variables and none of the zygote's, and the guard's defaults are read
    there ($CCSUP_GUARD_DIR: where its record goes)."""
    assert MARKER in os.environ  # the zygote has it: it inherited the tests' environment
    env = {"PATH": os.environ["PATH"], "ONLY_HERE": "yes", "CCSUP_GUARD_DIR": str(tmp_path)}
    script = f'echo "$ONLY_HERE ${{{MARKER}-none}}" >&2; exit 4'
    _, code, err = spawn_and_wait(zygote, ["sh", "-c", script], env=env)
    assert (code, err) == (4, b"yes none\n")
    assert len(list(tmp_path.glob("*.json"))) == 1


def test_a_bad_cwd_is_an_oserror_and_the_zygote_serves_on(zygote, tmp_path):
    with pytest.raises(FileNotFoundError) as caught:
        spawn_and_wait(zygote, ["true"], cwd=str(tmp_path / "missing"))
    assert (caught.value.strerror, caught.value.filename) == (
        "No such file or directory",
        str(tmp_path / "missing"),
    )
    assert (
        spawn_and_wait(
            zygote, ["sh", "-c", 'test "$PWD" = "$0"', str(tmp_path)], cwd=str(tmp_path)
        )[1]
        == 0
    )


# glibc's own signals, 32 and 33 (thread cancellation, setxid): neither Python nor a guard can
# set them, and glibc's posix_spawn, which Python 3.13's subprocess uses, leaves them ignored in
# the child (the directly started guard here) when the parent has handlers for them.
_GLIBC_SIGNALS = 1 << 31 | 1 << 32


def signal_state(pid: int) -> dict[str, int]:
    fields = ("SigBlk", "SigIgn", "SigCgt")
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {
        line.split(":")[0]: int(line.split()[1], 16) & ~_GLIBC_SIGNALS
        for line in lines
        if line.startswith(fields)
    }


def test_a_forked_guard_has_the_signal_state_of_a_directly_started_one(zygote):
    from guardd.launch import guard_command

    argv = ["--grace", "0.2", "--", "sh", "-c", "echo ready; read line || true"]
    direct = subprocess.Popen(guard_command(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    try:
        forked = zygote.spawn(argv, cwd=None, env=dict(os.environ), stdio=(in_r, out_w, 2))
        os.close(forked.pidfd)
        for fd in (in_r, out_w):
            os.close(fd)
        assert direct.stdout.readline() == b"ready\n"
        with os.fdopen(out_r, "rb") as out:
            assert out.readline() == b"ready\n"
            # Settled: CMD can print before its guard, resumed at CMD's exec, has unblocked the
            # signals it blocks across the clone (guardd._spawn).
            wait_until(
                lambda: signal_state(forked.pid) == signal_state(direct.pid),
                timeout=2,
                what="the same signal state",
            )
    finally:
        os.close(in_w)
        direct.stdin.close()
        assert direct.wait(10) == 0
        direct.stdout.close()


def test_a_child_whose_answer_never_reached_the_supervisor_runs_nothing(monkeypatch, tmp_path):
    from guardd.zygote_wire import encode

    tag = f"zygote-test-{os.getpid()}-{time.monotonic_ns()}"
    monkeypatch.setenv("ZYGOTE_TEST_TAG", tag)  # carried by the zygote and every child it forks
    zygote = Zygote.start()
    witness = tmp_path / "ran"
    os.kill(zygote.pid, signal.SIGSTOP)
    null = os.open(os.devnull, os.O_RDWR)
    try:
        request = encode(("spawn", ["--", "touch", str(witness)], None, dict(os.environ)))
        import socket

        assert socket.send_fds(zygote.sock, [request], [null, null, null]) == len(request)
    finally:
        os.close(null)
    zygote.sock.close()  # the supervisor is gone before the answer: the zygote forks, cannot answer
    os.kill(zygote.pid, signal.SIGCONT)
    assert zygote.proc.wait(10) == 0
    wait_until(
        lambda: not procs.processes_with_env("ZYGOTE_TEST_TAG", tag),
        timeout=5,
        what="the forked child to exit",
    )
    assert not witness.exists()
    zygote.close()


def test_a_stuck_zygote_is_killed_and_starts_nothing(zygote, tmp_path):
    witness = tmp_path / "ran"
    os.kill(zygote.pid, signal.SIGSTOP)
    stdin_r, stdin_w = os.pipe()
    with pytest.raises(ZygoteGone, match="did not answer within 0.3 s"):
        zygote.spawn(
            ["--", "touch", str(witness)],
            cwd=None,
            env=dict(os.environ),
            stdio=(stdin_r, stdin_r, stdin_r),
            timeout=0.3,
        )
    for fd in (stdin_r, stdin_w):
        os.close(fd)
    assert not zygote.alive and zygote.proc.returncode == -signal.SIGKILL
    assert not witness.exists()  # stopped before it read the request: it forked nothing


def test_the_zygote_exits_when_its_supervisor_is_killed(tmp_path):
    holder = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        from guardd.zygote_handle import Zygote
        z = Zygote.start()
        print(z.pid, flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([PYTHON, "-c", holder], stdout=subprocess.PIPE)
    try:
        pid = int(proc.stdout.readline())
        ident = procs.identity_of(pid)
        assert procs.process_running(ident)
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    wait_until(lambda: not procs.process_running(ident), timeout=2, what="the zygote to exit")


def with_launcher(body, **options):
    """`await body(launcher)` with a started Launcher(**options), closed whatever happens; what
    body returns."""

    async def scenario():
        launcher = Launcher(**options)
        launcher.start()
        try:
            return await body(launcher)
        finally:
            launcher.close()

    return asyncio.run(scenario())


@pytest.mark.parametrize("python", ["/nonexistent/python3", "/bin/false"])
def test_a_zygote_that_cannot_start_is_tried_later_each_time_and_guards_start_directly(
    tmp_path, python
):
    """A python that is not there (Popen fails) or that exits at once (the zygote is never ready):
    guards start directly, and the zygote is tried again after 0.1, 0.2, 0.4 s... not in a tight
    loop, and never after close()."""
    launches: list[float] = []

    def counted(python):
        launches.append(time.monotonic())
        return Zygote.launch(python)

    async def direct_then_close(launcher):
        guard = ask(launcher, "t1", ["sh", "-c", "exit 4"], tmp_path)
        if type(guard) is PendingGuard:  # asked of /bin/false before its end was seen
            guard = await started(guard)
        assert type(guard) is spawn.GuardProcess and procs.read_stat(guard.pid).ppid == os.getpid()
        done = asyncio.Event()
        guard.attach(
            asyncio.get_running_loop(),
            made(tmp_path / "t1"),
            on_output=lambda *a: None,
            on_exit=done.set,
        )
        await asyncio.wait_for(done.wait(), 10)
        assert guard.reap() == 4
        guard.close()
        deadline = time.monotonic() + 10
        while len(launches) < 4:  # at 0, 0.1, 0.3, 0.7 s (and the time to see each one fail)
            assert time.monotonic() < deadline, launches
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.5)  # the fifth is 0.8 s after the fourth
        launcher.close()
        assert len(launches) == 4
        await asyncio.sleep(0.6)  # past when the fifth was due
        assert len(launches) == 4  # close() cancelled the next try

    with_launcher(direct_then_close, python=python, launch_zygote=counted, restart_after=0.1)
    waits = [b - a for a, b in zip(launches, launches[1:], strict=False)]
    for wait, least in zip(waits, (0.1, 0.2, 0.4), strict=True):  # twice as long each time
        assert least <= wait < 2 * least + 0.2, waits


def test_a_lost_zygote_is_replaced_and_the_new_one_forks_the_next_guards(tmp_path):
    """Killed twice: each time a new zygote is started after restart_after (the lost one was
    ready, so the wait does not grow), and the next guard is its child, its status exact."""

    async def replace_twice(launcher):
        for _ in range(2):
            zygote = launcher.zygote
            assert zygote is not None
            # It ends when told: `exit 6` at once could be gone (and reaped) before its parent
            # is read, as it was once on a loaded machine.
            go = tmp_path / f"go-{zygote.pid}"
            end_when_told = f"while [ ! -e {go} ]; do sleep 0.01; done; exit 6"
            guard = await started(ask(launcher, "t", ["sh", "-c", end_when_told], tmp_path))
            assert type(guard) is spawn.ForkedGuardProcess
            assert procs.read_stat(guard.pid).ppid == zygote.pid
            go.touch()
            logs = tmp_path / str(zygote.pid)
            logs.mkdir()
            assert (await follow_to_the_end(logs, [guard])) == [6]
            os.kill(zygote.pid, signal.SIGKILL)
            killed = time.monotonic()
            while launcher.zygote in (zygote, None):
                assert time.monotonic() - killed < 5, "no new zygote"
                await asyncio.sleep(0.01)
            assert 0.5 <= time.monotonic() - killed < 0.95  # not 1 s: its wait was not doubled
            assert zygote.proc.returncode == -signal.SIGKILL

    with_launcher(replace_twice, restart_after=0.5)


def test_a_launcher_follows_forked_guards_to_their_status(tmp_path):
    async def scenario():
        launcher = Launcher()
        launcher.start()
        assert launcher.zygote is not None
        guards, done = [], []
        for n, code in enumerate((0, 5, 9)):
            pending = ask(
                launcher, f"t{n}", ["sh", "-c", f"exit {code}"], tmp_path, env={"X": None}
            )
            assert type(pending) is PendingGuard  # pipelined: the answer comes on the loop
            guard = await started(pending)
            assert type(guard) is spawn.ForkedGuardProcess
            event = asyncio.Event()
            guard.attach(
                asyncio.get_running_loop(),
                made(tmp_path / f"t{n}"),
                on_output=lambda *a: None,
                on_exit=event.set,
            )
            guards.append(guard)
            done.append(event)
        for event in done:
            await asyncio.wait_for(event.wait(), 10)
        assert [g.reap() for g in guards] == [0, 5, 9]
        for guard in guards:
            guard.close()
        launcher.close()

    asyncio.run(scenario())


def test_a_launcher_whose_zygote_died_sees_its_guards_end_and_starts_the_next_directly(tmp_path):
    async def scenario():
        loop = asyncio.get_running_loop()
        launcher = Launcher(restart_after=60)  # no new zygote within this test
        launcher.start()
        zygote = launcher.zygote
        guard = await started(
            ask(launcher, "t1", ["sh", "-c", "read line; exit 3"], tmp_path)
        )  # no hints
        ended = asyncio.Event()
        guard.attach(loop, made(tmp_path / "t1"), on_output=lambda *a: None, on_exit=ended.set)
        os.kill(zygote.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while launcher.zygote is not None:  # the launcher sees its socket's EOF
            assert time.monotonic() < deadline, "the launcher did not notice the zygote's end"
            await asyncio.sleep(0.01)
        assert zygote.proc.returncode == -signal.SIGKILL  # and reaped it
        guard.write_stdin(b"x\n", eof=True)
        await asyncio.wait_for(ended.wait(), 10)
        assert guard.reap() == spawn.STATUS_UNKNOWN  # nobody could report it; the record says 3
        assert procs.read_stat(guard.pid) is None or procs.read_stat(guard.pid).zombie
        guard.close()
        direct = ask(launcher, "t2", ["true"], tmp_path)
        assert (
            type(direct) is spawn.GuardProcess and procs.read_stat(direct.pid).ppid == os.getpid()
        )
        done = asyncio.Event()
        direct.attach(loop, made(tmp_path / "t2"), on_output=lambda *a: None, on_exit=done.set)
        await asyncio.wait_for(done.wait(), 10)
        assert direct.reap() == 0
        direct.close()
        launcher.close()

    asyncio.run(scenario())


# -- pipelined requests and the zygote's faults with requests in flight ---------------------------


async def start_many(
    launcher, tmp_path, ran: Path, n: int, code: int = 3, reads: bool = False
) -> list:
    """n guards asked at once, before any answer is read; each CMD notes that it ran (after it
    read a line of its stdin, with `reads`)."""
    first = "read line; " if reads else ""
    return [
        ask(
            launcher,
            f"p{i}",
            ["sh", "-c", f'{first}echo "p{i}" >> {ran}; exit {code}'],
            tmp_path / "guards",
        )
        for i in range(n)
    ]


def ask(launcher, turn_id: str, argv: list[str], record_dir: Path, env: dict | None = None):
    """launcher.start_guard with this file's guard options: grace 0.2 s, scan 1 s, no bus."""
    return launcher.start_guard(
        GuardSpec(
            turn_id,
            argv,
            cwd=None,
            env={} if env is None else env,
            record_dir=record_dir,
            grace=0.2,
            scan=1.0,
            bus=None,
        )
    )


def made(log_dir):
    """A turn's log directory, made as the start makes it before its guard is followed."""
    log_dir.mkdir()
    return log_dir


async def follow_to_the_end(tmp_path, guards: list, stdin: bytes | None = None) -> list[int | None]:
    """Each guard attached (its CMD given stdin, then EOF, when given) and awaited to its end;
    their statuses, in order."""
    loop = asyncio.get_running_loop()
    ended = []
    for n, guard in enumerate(guards):
        event = asyncio.Event()
        guard.attach(loop, made(tmp_path / f"log{n}"), on_output=lambda *a: None, on_exit=event.set)
        if stdin is not None:
            guard.write_stdin(stdin, eof=True)
        ended.append(event)
    for event in ended:
        await asyncio.wait_for(event.wait(), 20)
    statuses = [g.reap() for g in guards]
    for guard in guards:
        guard.close()
    return statuses


def ran_turns(ran: Path) -> list[str]:
    return ran.read_text().split() if ran.exists() else []


def test_pipelined_requests_are_answered_in_order_with_exact_statuses(tmp_path):
    ran = tmp_path / "ran"

    async def scenario():
        launcher = Launcher()
        launcher.start()
        pendings = await start_many(launcher, tmp_path, ran, 40)
        assert all(type(p) is PendingGuard for p in pendings) and launcher.waiting == 40
        guards = [await started(p) for p in pendings]
        assert all(type(g) is spawn.ForkedGuardProcess for g in guards)
        assert [g.turn_id for g in guards] == [f"p{i}" for i in range(40)]
        assert await follow_to_the_end(tmp_path, guards) == [3] * 40
        for guard in guards:  # each answer went to its own request: the record names its turn
            assert json.loads(guard.record_path.read_text())["turn"] == guard.turn_id
        launcher.close()

    asyncio.run(scenario())
    assert sorted(ran_turns(ran)) == sorted(f"p{i}" for i in range(40))


def test_an_answer_that_comes_while_the_launcher_reads_is_taken_at_once(tmp_path):
    """An answer that arrives after the launcher read the answers and before it took the reports
    is taken at the socket's next event, not left for the watchdog (which would kill the zygote
    and start the turn directly). Made to happen: a guard's end is reported just before the next
    request's answer (the zygote, stopped meanwhile, reaps before it reads), and the read of
    answers waits, as a busy loop would, until that answer has arrived."""

    async def scenario():
        launcher = Launcher(answer_timeout=3.0)
        launcher.start()
        zygote = launcher.zygote
        loop = asyncio.get_running_loop()

        def ask_reading(name: str):
            return ask(launcher, name, ["sh", "-c", "read line; exit 4"], tmp_path / "guards")

        first = await started(ask_reading("first"))
        # Running (its record is written once CMD runs), so the zygote has written its go.
        wait_until(first.record_path.exists, what="the first guard's record")
        ended = asyncio.Event()
        first.attach(loop, made(tmp_path / "log1"), on_output=lambda *a: None, on_exit=ended.set)
        os.kill(zygote.pid, signal.SIGSTOP)
        pending = ask_reading("second")
        first.write_stdin(b"\n", eof=True)
        wait_until(lambda: procs.read_stat(first.pid).zombie, what="the first guard's end")
        real_answers = zygote.answers

        def answers_then_wait():
            got = real_answers()
            if launcher.waiting > len(got):  # its answer still to come: let it arrive now
                select.select([zygote.fileno()], [], [], 2)
            return got

        zygote.answers = answers_then_wait
        os.kill(zygote.pid, signal.SIGCONT)
        t0 = time.monotonic()
        second = await started(pending)
        assert time.monotonic() - t0 < 2 and type(second) is spawn.ForkedGuardProcess
        assert launcher.zygote is zygote  # not given up
        await asyncio.wait_for(ended.wait(), 10)
        statuses = await follow_to_the_end(tmp_path, [second], b"\n")
        assert (first.reap(), statuses) == (4, [4])
        first.close()
        launcher.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("fault", ["SIGKILL", "SIGSTOP"])
def test_a_zygote_killed_or_stopped_with_requests_in_flight_leaves_no_turn_unwatched(
    tmp_path, fault
):
    """Every request is settled exactly once, in order: the first k (those the zygote answered
    before the fault) are its forked guards; the rest go to a new zygote started at once when
    k > 0, else start directly. No turn runs twice; every turn of the new zygote or started
    directly runs with its exact status; a stopped zygote is killed after answer_timeout."""
    ran = tmp_path / "ran"
    n = 30

    async def fault_in_flight(launcher):
        lost = launcher.zygote
        pendings = await start_many(launcher, tmp_path, ran, n, reads=True)
        os.kill(lost.pid, getattr(signal, fault))  # before the loop has read any answer
        guards = [await started(p) for p in pendings]
        assert lost.proc.returncode == -signal.SIGKILL
        new = launcher.zygote
        parents = [procs.read_stat(g.pid).ppid for g in guards]  # each waits for its stdin
        statuses = await follow_to_the_end(tmp_path, guards, b"\n")  # none left, whatever fails
        k = sum(
            type(g) is spawn.ForkedGuardProcess and (new is None or p != new.pid)
            for g, p in zip(guards, parents, strict=True)
        )
        if k:  # the rest were asked of a new zygote, started at once (restart_after is 60 s)
            assert new is not None and new is not lost
            rest = (spawn.ForkedGuardProcess, new.pid)
        else:  # it answered nothing: the rest were started directly
            assert new is None
            rest = (spawn.GuardProcess, os.getpid())
        assert all(type(g) is spawn.ForkedGuardProcess for g in guards[:k])
        kinds = [(type(g), p) for g, p in zip(guards[k:], parents[k:], strict=True)]
        assert kinds == [rest] * (n - k)
        # The lost zygote's guards: unknown (nobody reported; the record says how CMD ended).
        assert all(status in (3, spawn.STATUS_UNKNOWN) for status in statuses[:k])
        assert statuses[k:] == [3] * (n - k)
        return [g.turn_id for g in guards[k:]]

    again = with_launcher(fault_in_flight, answer_timeout=0.5, restart_after=60)
    runs = ran_turns(ran)
    assert len(runs) == len(set(runs))  # no turn ran twice
    assert set(again) <= set(runs)


def test_requests_a_working_zygote_left_unanswered_go_to_a_new_one_started_at_once(tmp_path):
    """A zygote that answered a request, then stopped with 30 more asked and killed: a new zygote
    is started at once (restart_after is 60 s) and forks all 30, in order, with exact statuses;
    none is started directly and none runs twice."""
    ran = tmp_path / "ran"
    n = 30

    async def stopped_then_killed(launcher):
        lost = launcher.zygote
        first = await started(ask(launcher, "first", ["true"], tmp_path / "guards"))
        os.kill(lost.pid, signal.SIGSTOP)
        pendings = await start_many(launcher, tmp_path, ran, n, reads=True)
        os.kill(lost.pid, signal.SIGKILL)
        guards = [await started(p) for p in pendings]
        new = launcher.zygote
        parents = [procs.read_stat(g.pid).ppid for g in guards]  # each waits for its stdin
        statuses = await follow_to_the_end(tmp_path, [first, *guards], b"\n")
        assert new is not None and new is not lost and lost.proc.returncode == -signal.SIGKILL
        assert [g.turn_id for g in guards] == [p.turn_id for p in pendings]
        assert all(type(g) is spawn.ForkedGuardProcess for g in guards)
        assert parents == [new.pid] * n
        assert statuses[1:] == [3] * n

    with_launcher(stopped_then_killed, answer_timeout=60, restart_after=60)
    assert sorted(ran_turns(ran)) == sorted(f"p{i}" for i in range(n))


def settled_futures(pendings, note) -> list[asyncio.Future]:
    """A future for each PendingGuard, set to what it is settled with, after note(that)."""
    loop = asyncio.get_running_loop()
    futures = []
    for pending in pendings:
        future = loop.create_future()

        def done(result, future=future):
            note(result)
            future.set_result(result)

        pending.then(done)
        futures.append(future)
    return futures


def test_close_while_unanswered_requests_are_asked_again_settles_the_rest_as_stopping(tmp_path):
    """close() after 3 of 40 unanswered requests were started directly: the other 37 are settled
    with "the supervisor is stopping", nothing more is started, and no callback fails."""
    ran = tmp_path / "ran"
    n = 40

    async def scenario():
        loop = asyncio.get_running_loop()
        failures: list[dict] = []
        loop.set_exception_handler(lambda loop, context: failures.append(context))
        launcher = Launcher(answer_timeout=0.3, restart_after=60)
        launcher.start()
        os.kill(launcher.zygote.pid, signal.SIGSTOP)
        pendings = await start_many(launcher, tmp_path, ran, n, reads=True)
        results: list = []
        futures = settled_futures(pendings, results.append)
        while len(results) < 3:
            await asyncio.sleep(0)
        launcher.close()
        await asyncio.wait_for(asyncio.gather(*futures), 20)
        await asyncio.sleep(0.1)  # a step of the asking again still due would run now
        guards = [r for r in results if not isinstance(r, OSError)]
        statuses = await follow_to_the_end(tmp_path, guards, b"\n")
        stopping = [r for r in results if isinstance(r, OSError)]
        assert failures == []
        assert 3 <= len(guards) <= 4 and len(guards) + len(stopping) == n
        assert all("the supervisor is stopping" in str(e) for e in stopping)
        assert statuses == [3] * len(guards)
        return guards

    guards = asyncio.run(scenario())
    assert sorted(ran_turns(ran)) == sorted(g.turn_id for g in guards)


def test_requests_a_zygote_never_answered_start_directly_one_a_loop_turn(tmp_path):
    """A zygote stopped before it answered anything: after answer_timeout it is killed, and the
    40 requests start directly, in order, one per turn of the loop (other callbacks run between
    them), each with its exact status; a new zygote is tried after restart_after, not at once."""
    ran = tmp_path / "ran"
    n = 40

    async def stopped_from_the_start(launcher):
        lost = launcher.zygote
        os.kill(lost.pid, signal.SIGSTOP)
        pendings = await start_many(launcher, tmp_path, ran, n, reads=True)
        settled: list[str] = []
        ticks: list[int] = []  # how many were settled at each turn of the loop
        # An OSError has no turn_id: the test fails there.
        futures = settled_futures(pendings, lambda guard: settled.append(guard.turn_id))

        async def tick():
            while len(settled) < n:
                ticks.append(len(settled))
                await asyncio.sleep(0)

        ticking = asyncio.ensure_future(tick())
        guards = [await asyncio.wait_for(f, 20) for f in futures]
        await ticking
        statuses = await follow_to_the_end(tmp_path, guards, b"\n")  # none left, whatever fails
        assert launcher.zygote is None and lost.proc.returncode == -signal.SIGKILL
        assert settled == [p.turn_id for p in pendings]  # in order
        assert all(type(g) is spawn.GuardProcess for g in guards)
        steps = [b - a for a, b in zip(ticks, ticks[1:], strict=False) if b != a]
        assert steps and max(steps) <= 2, ticks  # not all in one go
        assert statuses == [3] * n

    with_launcher(stopped_from_the_start, answer_timeout=0.5, restart_after=60)
    assert sorted(ran_turns(ran)) == sorted(f"p{i}" for i in range(n))


def _pyc(source: Path) -> Path:
    import importlib.util

    return Path(importlib.util.cache_from_source(str(source)))


def test_guardd_is_compiled_before_a_zygote_starts_and_only_what_changed_again(tmp_path):
    """The zygote's image is read from .pyc files, not compiled (a compiled image gave every
    guard ~0.1 MiB more): each module without one gets one, a source newer than its .pyc gets a
    new one, and the rest are left as they are."""
    from guardd import zygote_handle

    package = tmp_path / "guardd"
    package.mkdir()
    for source in (ROOT / "guardd").glob("*.py"):
        (package / source.name).write_bytes(source.read_bytes())
    (package / "broken.py").write_text("def (:\n")  # the import will say it; nothing here
    zygote_handle.compile_package(str(package))
    sources = sorted(package.glob("*.py"))
    assert len(sources) > 10
    compiled = {s.name: _pyc(s).stat().st_mtime_ns for s in sources if s.name != "broken.py"}
    assert len(compiled) == len(sources) - 1
    assert not _pyc(package / "broken.py").exists()

    later = time.time() + 10
    os.utime(package / "guard.py", (later, later))
    zygote_handle.compile_package(str(package))
    again = {s.name: _pyc(s).stat().st_mtime_ns for s in sources if s.name != "broken.py"}
    assert [name for name in compiled if again[name] != compiled[name]] == ["guard.py"]

    # A .pyc that cannot be written (its directory is a file) is left to the import, silently.
    (package / "__pycache__").rename(tmp_path / "moved")
    (package / "__pycache__").write_text("")
    zygote_handle.compile_package(str(package))


def test_a_zygote_is_launched_after_guardd_is_compiled(monkeypatch):
    from guardd import zygote_handle

    compiled: list[bool] = []
    monkeypatch.setattr(zygote_handle, "compile_package", lambda: compiled.append(True))
    zygote = Zygote.launch()
    try:
        assert compiled == [True]
        zygote.wait_ready()
    finally:
        zygote.close()


def test_two_guards_killed_at_once_each_report_only_after_their_stubborn_strays_are_gone(
    zygote, tmp_path
):
    """guardd.strays: the zygote is the subreaper of what its lost guards leave; a guard's exit
    is reported only once none of its strays lives, whichever guard a stray is counted against."""
    strays, guards, fds = [], [], []
    for n in range(2):
        pidfile = tmp_path / f"stray{n}.pid"
        # A stray that left the group and session, dropped the environment and ignores SIGTERM.
        cmd = f"setsid env -i sh -c 'trap \"\" TERM; echo $$ > {pidfile}; exec sleep 30' & wait"
        null = os.open(os.devnull, os.O_RDWR)
        try:
            spawned = zygote.spawn(
                ["--grace", "0.5", "--scan", "30", "--", "sh", "-c", cmd],
                cwd=None,
                env=dict(os.environ),
                stdio=(null, null, null),
            )
        finally:
            os.close(null)
        fds.append(spawned.pidfd)
        guards.append(spawned.pid)
        pid = int(wait_until(lambda p=pidfile: p.exists() and p.read_text().strip()))
        strays.append(procs.identity_of(pid))
    killed_at = time.monotonic()
    for pid in guards:
        os.kill(pid, signal.SIGKILL)
    reported: dict[int, float] = {}
    deadline = time.monotonic() + 15
    while len(reported) < 2:
        for pid, code in zygote.poll_reports():
            assert code == -9
            # Its stray ignored SIGTERM: only the SIGKILL after the grace ended it, before this.
            assert not procs.process_running(strays[guards.index(pid)])
            reported[pid] = time.monotonic()
        assert time.monotonic() < deadline, f"reports so far: {reported}"
        select.select([zygote.fileno()], [], [], 0.2)
    assert set(reported) == set(guards)
    assert min(reported.values()) - killed_at >= 0.5
    assert not any(procs.process_running(s) for s in strays)
    for fd in fds:
        os.close(fd)
