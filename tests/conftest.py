"""Shared test plumbing: a marker that every process a test starts inherits, and a check that none
is left running when the test ends (a leftover is a containment bug; it is killed by pid and the
test fails).

Two variables mark what tests start. `CCSUP_TEST_RUN`: the pytest process that runs the tests (one
per xdist worker, `<run>-<worker>`), checked after every test; a worker never sees, so never kills,
another worker's processes. `CCSUP_TEST_SESSION`: the whole session, controller and workers; when
the session ends, however it ends (passed, failed, Ctrl-C, SIGTERM), the process that started it
kills by pid every process still marked with it, also those whose worker was killed mid-test.
SIGTERM is taken as Ctrl-C (pytest's teardown runs), and Ctrl-C works even when the shell that
started pytest ignored SIGINT for it (a background job of a script).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from guardd import procs
from supervisor.polling import wait_until

ROOT = Path(__file__).resolve().parent.parent
# Helper modules and scripts the tests share (tests/helpers/), importable by name.
HELPERS = ROOT / "tests" / "helpers"
sys.path.insert(0, str(HELPERS))

# The etcd cluster and relay fixtures (tests/helpers/etcd_cluster.py).
pytest_plugins = ["etcd_cluster"]
MARKER = "CCSUP_TEST_RUN"
SESSION = "CCSUP_TEST_SESSION"
os.environ.setdefault(MARKER, uuid.uuid4().hex)
# Every child of this pytest carries the marker; a parallel pytest run has its own, and so has each
# xdist worker (set in pytest_configure, before any test runs).
RUN_ID = os.environ[MARKER]
PYTHON = sys.executable


def pytest_configure(config):
    global RUN_ID
    worker = getattr(config, "workerinput", None)
    if worker is not None:  # an xdist worker: the session's marker came from its controller
        RUN_ID = os.environ[MARKER] = f"{os.environ[MARKER]}-{worker['workerid']}"
        # execnet gives its workers COLUMNS=80 and LINES=24, which curses, `ccsup run -t` and
        # every program in a test's tmux pane would take over the pane's own size.
        for name in ("COLUMNS", "LINES"):
            os.environ.pop(name, None)
        return
    os.environ[SESSION] = uuid.uuid4().hex  # this session's own, even inside another's test
    _compile_sources()
    if getattr(config.option, "dist", "no") == "load":  # `-n N`: keep xdist_group's tests together
        config.option.dist = "loadgroup"
    signal.signal(signal.SIGTERM, _interrupt)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _compile_sources() -> None:
    """Write the `.pyc` of our packages before any test starts a process, as `pip install` does
    for an installed copy. An editable install has none, and where PYTHONDONTWRITEBYTECODE=1 is
    set (this machine's image, CI's) every supervisor, CLI call and helper the tests start would
    compile what it imports from source: 0.24 s more CPU for each supervisor's start, about a
    fifth of the suite's CPU. Python reads a `.pyc` even with that variable set; one that cannot
    be written (a read-only checkout) is compiled by each import, as before."""
    import compileall

    for package in ("supervisor", "guardd", "tests/helpers"):
        compileall.compile_dir(ROOT / package, quiet=2)


# Tests that run a real harness (node, a bundle of tens of MB, a CPU-hungry start): one at a time
# on one xdist worker, as the suite ran them serially, while the other workers take the rest.
# Four at once on 2 cores made each 3-5 times slower and past their timeouts.
HARNESS_FILES = frozenset(
    {
        "test_claude.py",
        "test_codex.py",
        "test_opencode.py",
        "test_quota_harnesses.py",
        "test_wrap.py",
        "test_mcp_install.py",
    }
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in HARNESS_FILES and item.path.parent.name == "agents":
            item.add_marker(pytest.mark.xdist_group("harness"))


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.hookimpl(trylast=True)  # after xdist has stopped its workers
def pytest_sessionfinish(session):
    if getattr(session.config, "workerinput", None) is not None:
        return
    session_id = os.environ[SESSION]

    def marked() -> list[procs.Identity]:
        return [i for i in procs.processes_with_env(SESSION, session_id) if i.pid != os.getpid()]

    for _ in range(20):  # a process forking as it is killed: again until none is left
        left = marked()
        if not left:
            return
        for ident in left:
            procs.signal_process(ident, signal.SIGCONT)
            procs.signal_process(ident, signal.SIGKILL)
        try:
            wait_until(lambda: not marked(), 0.5, 0.02)
        except TimeoutError:
            pass


# What a turn used, as `turn.<id>.exited` carries it (checked in tests/test_cgroup.py).
USAGE_KEYS = (
    "wall_s",
    "wait_s",
    "cpu_user_s",
    "cpu_system_s",
    "peak_rss_bytes",
    "processes",
    "peak_mem",
)


def without_usage(body: dict) -> dict:
    """An exited event's body without the usage figures (which vary from run to run)."""
    return {k: v for k, v in body.items() if k not in USAGE_KEYS}


# when, by which run, in what order it went out; exited_at: when its command ended (the guard's)
STAMPS = ("ts", "epoch", "seq", "turn_seq", "exited_at")


def story(body: dict) -> dict:
    """An event's body as a test compares it exactly: no stamps, no usage figures."""
    return {k: v for k, v in without_usage(body).items() if k not in STAMPS}


def leftovers() -> list[procs.Identity]:
    """Processes started under this test run that are still running (zombies do not count)."""
    me = os.getpid()
    found = []
    for ident in procs.processes_with_env(MARKER, RUN_ID):
        if ident.pid == me:
            continue
        found.append(ident)
    return found


# What a fixture wider than one test owns (a module's browser: its process group, and the
# processes its start made outside that group): not a test's leftovers; that fixture ends them by
# pid when its scope ends.
SHARED_GROUPS: set[int] = set()
SHARED: set[procs.Identity] = set()


def _shared(ident: procs.Identity) -> bool:
    if ident in SHARED:
        return True
    stat = procs.read_stat(ident.pid)
    return stat is not None and stat.pgid in SHARED_GROUPS


def _ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        stat = procs.read_stat(pid)
        if stat is None:
            break
        pid = stat.ppid
    return pids


@pytest.fixture(autouse=True)
def no_process_left():
    """After each test, everything the test started must be gone (2 s allowed); else kill and fail."""
    yield
    ancestors = _ancestors()

    def survivors() -> list[procs.Identity]:
        return [i for i in leftovers() if i.pid not in ancestors and not _shared(i)]

    try:
        wait_until(lambda: not survivors(), 2.0, 0.02)
    except TimeoutError:
        pass
    left = survivors()
    if left:
        described = []
        for ident in left:
            try:
                cmd = Path(f"/proc/{ident.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                cmd = "?"
            described.append(f"{ident.pid} {cmd.strip()}")
            procs.signal_process(ident, signal.SIGCONT)
            procs.signal_process(ident, signal.SIGKILL)
        pytest.fail("processes left running (killed now): " + "; ".join(described))


def zygote_of(daemon_pid: int) -> int:
    """The daemon's child that runs guardd.zygote."""
    found = []
    for task in os.listdir(f"/proc/{daemon_pid}/task"):
        for child in Path(f"/proc/{daemon_pid}/task/{task}/children").read_text().split():
            try:
                cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            except OSError:  # a child that ended while it was looked at
                continue
            if b"guardd.zygote" in cmdline:
                found.append(int(child))
    assert len(found) == 1, found
    return found[0]


@pytest.fixture
def state_dir():
    """A short private state directory (ipc:// paths must stay under 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="ccsup-t-", dir="/tmp"))
    os.chmod(path, 0o700)
    yield path
    import shutil

    shutil.rmtree(path, ignore_errors=True)
    shutil.rmtree(f"{path}.other", ignore_errors=True)  # another supervisor's (test_slots' HOLDER)


# -- a real supervisor in a temporary state directory ---------------------------------------------


def write_config(
    state_dir: Path,
    *,
    caps: str = "codex = 2",
    grace: str = "300ms",
    scan: str = "200ms",
    extra: str = "",
    guard_extra: str = "",
    adopt_within: str = "0s",
) -> Path:
    """`extra`: lines of [slots]; `guard_extra`: lines of [guard]. adopt_within "0s" by default
    (unless guard_extra sets it): a test that kills its supervisor expects its turns to end with
    it, as they did before adoption (the adoption tests give a duration)."""
    path = state_dir / "ccsup.toml"
    adopt = "" if "adopt_within" in guard_extra else f'adopt_within = "{adopt_within}"\n'
    path.write_text(
        f'[slots]\ncaps = {{ {caps} }}\n{extra}\n[guard]\ngrace = "{grace}"\nscan = "{scan}"\n'
        f"{adopt}{guard_extra}\n"
    )
    return path


class RunningDaemon:
    """`ccsup start --foreground` as a child of the test, found again by its state directory."""

    def __init__(self, state_dir: Path, config: Path):
        self.state_dir = state_dir
        self.config = config
        self.proc = None
        self.stderr_path = state_dir / "daemon.stderr"
        self.program = ["-m", "supervisor"]  # what PYTHON runs (a test helper may wrap ccsup)

    def start(self, *extra: str, timeout: float = 30.0) -> RunningDaemon:
        import subprocess

        command = [
            PYTHON,
            *self.program,
            "--state-dir",
            str(self.state_dir),
            "--config",
            str(self.config),
            "start",
            "--foreground",
            *extra,
        ]
        with open(self.stderr_path, "ab") as err:
            self.proc = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=err, stderr=err, start_new_session=True
            )
        from supervisor.errors import CcsupError

        def answering() -> bool:
            if self.proc.poll() is not None:
                pytest.fail(
                    f"the daemon exited {self.proc.returncode}: {self.stderr_path.read_text()[-2000:]}"
                )
            try:
                with self.client(timeout=1.0) as client:  # a subclass may find it another way
                    client.status()
                return True
            except CcsupError:
                return False

        wait_until(answering, timeout, 0.02, "the daemon to answer status")
        return self

    def client(self, timeout: float = 5.0):
        from supervisor.client import Client

        return Client(self.state_dir, timeout=timeout)

    def stop(self, timeout: float = 30.0) -> int:
        from supervisor.errors import CcsupError

        try:
            with self.client() as client:
                client.quit()
        except CcsupError:
            pass
        return self.proc.wait(timeout)

    def kill(self) -> None:
        """SIGKILL the supervisor, by pid, and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def cleanup():
    """A list to put what a test starts in (a Popen, or a guardd.procs.Identity): each is
    SIGKILLed by its pid (an identity's through a pidfd) at the end."""
    started: list = []
    yield started
    for thing in started:
        if isinstance(thing, subprocess.Popen):
            thing.kill()
            thing.wait()
        elif procs.process_running(thing):
            procs.signal_process(thing, signal.SIGKILL)


@pytest.fixture
def daemon(state_dir):
    """A factory: daemon(caps=..., grace=...) starts a supervisor; all are stopped afterwards."""
    started: list[RunningDaemon] = []

    def make(start: bool = True, **config) -> RunningDaemon:
        d = RunningDaemon(state_dir, write_config(state_dir, **config))
        started.append(d)
        return d.start() if start else d

    yield make
    for d in started:
        if d.proc is not None and d.proc.poll() is None:
            try:
                d.stop(timeout=20)
            except Exception:
                d.kill()
    for d in started:
        if d.proc is not None:
            remove_supervisor_cgroups(d.proc.pid)


def remove_supervisor_cgroups(pid: int) -> None:
    """The cgroups a (stopped or killed) supervisor of this test made, `ccsup.<pid>.*`: whatever
    is still inside is killed, then they are removed (no cgroup named ccsup is left behind)."""
    from guardd import cgroup

    base = cgroup.find_auto()
    if base is None:
        return
    for parent in Path(base).glob(f"ccsup.{pid}.*"):
        for sub in [*parent.iterdir(), parent]:
            if sub.is_dir():
                cgroup.kill(str(sub))
                cgroup.wait_empty(str(sub), 5)
                cgroup.remove(str(sub))


class EventLog:
    """Every bus event, collected by a thread from a live subscription, for tests to wait on."""

    def __init__(self, daemon: RunningDaemon, prefixes=("",)):
        import threading

        self.events: list[tuple[str, dict, float]] = []
        self._cond = threading.Condition()
        self._client = daemon.client()
        self._sub = self._client.subscribe(list(prefixes))
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop:
            event = self._sub.recv(0.05)
            if event is not None:
                with self._cond:
                    self.events.append((event[0], event[1], time.monotonic()))
                    self._cond.notify_all()

    def topics(self, prefix: str = "") -> list[str]:
        with self._cond:
            return [t for t, _, _ in self.events if t.startswith(prefix)]

    def find(self, topic: str) -> list[dict]:
        with self._cond:
            return [b for t, b, _ in self.events if t == topic]

    def wait_for(self, topic: str, timeout: float = 15.0) -> dict:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for t, body, _ in self.events:
                    if t == topic:
                        return body
                left = deadline - time.monotonic()
                if left <= 0:
                    pytest.fail(
                        f"no {topic} within {timeout}s; saw {[t for t, _, _ in self.events][-20:]}"
                    )
                self._cond.wait(left)

    def time_of(self, topic: str) -> float:
        with self._cond:
            return next(at for t, _, at in self.events if t == topic)

    def close(self):
        self._stop = True
        self._thread.join(2)
        self._sub.close()
        self._client.close()


@pytest.fixture
def event_log():
    """A factory: event_log(daemon) follows its bus until the test ends."""
    logs: list[EventLog] = []

    def make(d: RunningDaemon, prefixes=("",)) -> EventLog:
        log = EventLog(d, prefixes)
        logs.append(log)
        return log

    yield make
    for log in logs:
        log.close()
