"""ccsup measured beside circus and supervisord, same workloads, same run.

    .venv/bin/python tests/bench/compare.py [--n 50] [--turns 200] [--cap 4] [--dir /tmp]

circus and supervisor (supervisord) are installed from PyPI into their own virtual environment,
/tmp/ccsup-anchors (created when missing; never the project's .venv: supervisord's package is also
called `supervisor`). Prints one JSON line per figure:

1. containment: N processes, each with a `setsid` grandchild that ignores SIGTERM, stopped with a
   1 s grace: grandchildren still running after the stop (circus with stop_children, supervisord
   with stopasgroup/killasgroup, ccsup: N turns at cap N, grace 1s, each cancelled).
2. stop latency (s) for that workload and for N processes that obey SIGTERM: from the stop
   command to every process the supervisor started being gone (ccsup: every turn released).
3. start N and wait until all run (each writes a file once it runs). circus and supervisord: one
   start command through their CLI (its start-up included); ccsup: N `request.turn` published in
   one burst on the bus from a publisher connected beforehand, as sidecars send them.
4. `--turns` turns of `sleep 0.05` at cap `--cap`: ccsup against a plain semaphore driver.
5. daemon RSS (MiB) with N running (ccsup's guards counted apart, one per turn: summed RSS and
   USS), and the median
   `status` round trip through each CLI (circusctl, supervisorctl, ccsup), process start included.

Clean-up: every process started here carries CCSUP_BENCH_RUN=<uuid> in its environment (circus
watchers get copy_env); at the end each one still running, and each grandchild that survived
circus/supervisord, is killed by pid (identity checked by start ticks), never by name.
State: everything lives in a temporary directory under --dir (/tmp by default; every system's
files go there, the workers' included: on an ext4 without a journal, such as this machine's, a
file made where many were removed in the last 30 s costs up to a millisecond, and ccsup makes four
per turn, a log directory, two logs and its guard's record, where circus and supervisord here keep
no output), removed at the end; a run stopped half-way
leaves processes that the marker finds (`grep -l CCSUP_BENCH_RUN /proc/*/environ`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
from bench_daemon import connected_publisher, request_turn

from guardd import procs
from supervisor.client import Client

ROOT = Path(__file__).resolve().parents[2]
ANCHORS = Path("/tmp/ccsup-anchors")
MARKER = "CCSUP_BENCH_RUN"
RUN = uuid.uuid4().hex

WORKER = r"""#!/bin/sh
# worker.sh MODE DIR: MODE stubborn starts a setsid grandchild that ignores SIGTERM first.
d=$2
if [ "$1" = stubborn ]; then
    setsid sh -c 'trap "" TERM; echo $$ > "$0/gc-$$"; exec sleep 600' "$d" &
fi
touch "$d/up-$$"
exec sleep 600
"""


def ensure_anchors() -> Path:
    bin_dir = ANCHORS / "bin"
    if not (bin_dir / "circusd").exists() or not (bin_dir / "supervisord").exists():
        subprocess.run([sys.executable, "-m", "venv", str(ANCHORS)], check=True)
        subprocess.run([str(bin_dir / "pip"), "install", "-q", "circus", "supervisor"], check=True)
    return bin_dir


def wait_for(predicate, timeout: float, what: str, interval: float = 0.01):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"compare: timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


class Workdir:
    """A directory the workers write into: up-<pid> when running, gc-<pid> for each grandchild."""

    def __init__(self, root: Path, name: str):
        self.path = root / name
        self.path.mkdir()
        self.idents: dict[int, procs.Identity] = {}

    def up(self) -> list[int]:
        return [int(p.name.split("-")[1]) for p in self.path.glob("up-*")]

    def grandchildren(self) -> list[int]:
        return [int(p.read_text()) for p in self.path.glob("gc-*") if p.read_text().strip()]

    def remember(self) -> None:
        for pid in self.up() + self.grandchildren():
            ident = procs.identity_of(pid)
            if ident is not None:
                self.idents.setdefault(pid, ident)

    def running(self, pids) -> list[int]:
        return [p for p in pids if p in self.idents and procs.process_running(self.idents[p])]

    def wait_started(self, n: int, stubborn: bool, timeout: float = 60) -> float:
        t0 = time.monotonic()
        wait_for(
            lambda: len(self.up()) >= n and (not stubborn or len(self.grandchildren()) >= n),
            timeout,
            f"{n} workers in {self.path}",
        )
        self.remember()
        return time.monotonic() - t0

    def kill_survivors(self) -> int:
        killed = 0
        for pid in self.running(list(self.idents)):
            if procs.signal_process(self.idents[pid], signal.SIGKILL):
                killed += 1
        return killed


def timed(argv: list[str], env=None) -> float:
    t0 = time.monotonic()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, timeout=60)
    return time.monotonic() - t0


def rss_mib(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


# -- circus ----------------------------------------------------------------------------------------


class Circus:
    name = "circus"

    def __init__(self, bin_dir: Path, root: Path, worker: Path, n: int):
        self.bin, self.root = bin_dir, root
        self.endpoint = f"ipc://{root}/circus-ctl"
        sections = [
            f"[circus]\nendpoint = {self.endpoint}\npubsub_endpoint = ipc://{root}/circus-pub\n"
            f"stats_endpoint = ipc://{root}/circus-stats\nstatsd = False\ncheck_delay = 0\n"
        ]
        for mode in ("obedient", "stubborn"):
            sections.append(
                f"[watcher:{mode}]\ncmd = /bin/sh {worker} {mode} {root}/circus-{mode}\n"
                f"numprocesses = {n}\ngraceful_timeout = 1\nstop_children = True\n"
                f"autostart = False\ncopy_env = True\nwarmup_delay = 0\n"
            )
        self.conf = root / "circus.ini"
        self.conf.write_text("\n".join(sections))
        self.dirs = {m: Workdir(root, f"circus-{m}") for m in ("obedient", "stubborn")}

    def start_daemon(self) -> None:
        self.proc = subprocess.Popen(
            [str(self.bin / "circusd"), str(self.conf)],
            stdout=subprocess.DEVNULL,
            stderr=open(self.root / "circusd.err", "wb"),
            start_new_session=True,
        )
        wait_for(
            lambda: subprocess.run(self.ctl("status"), capture_output=True).returncode == 0,
            30,
            "circusd",
        )

    def ctl(self, *args: str) -> list[str]:
        return [str(self.bin / "circusctl"), "--endpoint", self.endpoint, *args]

    def start(self, mode: str) -> None:
        # The arbiter runs one command at a time and refuses another ("arbiter is already
        # running watcher_stop command", exit 3) while it still finishes the last stop, after
        # the workers are gone: asked again, as a user would.
        deadline = time.monotonic() + 60
        while True:
            done = subprocess.run(self.ctl("start", mode), capture_output=True, timeout=60)
            if done.returncode == 0:
                return
            if b"already running" not in done.stdout + done.stderr or time.monotonic() > deadline:
                raise SystemExit(f"circusctl start {mode}: {(done.stdout + done.stderr).decode()}")
            time.sleep(0.05)

    def stop(self, mode: str) -> None:
        subprocess.run(self.ctl("stop", mode), stdout=subprocess.DEVNULL, timeout=60)

    def status_argv(self) -> list[str]:
        return self.ctl("status")

    def daemon_pid(self) -> int:
        return self.proc.pid

    def shutdown(self) -> None:
        subprocess.run(self.ctl("quit"), capture_output=True, timeout=60)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# -- supervisord -----------------------------------------------------------------------------------


class Supervisord:
    name = "supervisord"

    def __init__(self, bin_dir: Path, root: Path, worker: Path, n: int):
        self.bin, self.root = bin_dir, root
        sections = [
            f"[unix_http_server]\nfile={root}/sv.sock\n",
            f"[supervisord]\nlogfile={root}/sv.log\npidfile={root}/sv.pid\nnodaemon=true\nchildlogdir={root}\n",
            "[rpcinterface:supervisor]\nsupervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface\n",
            f"[supervisorctl]\nserverurl=unix://{root}/sv.sock\n",
        ]
        for mode in ("obedient", "stubborn"):
            sections.append(
                f"[program:{mode}]\ncommand=/bin/sh {worker} {mode} {root}/sv-{mode}\nnumprocs={n}\n"
                "process_name=%(program_name)s_%(process_num)02d\nautostart=false\nstartsecs=0\n"
                "stopasgroup=true\nkillasgroup=true\nstopwaitsecs=1\nstdout_logfile=NONE\n"
                "stderr_logfile=NONE\n"
            )
        self.conf = root / "supervisord.conf"
        self.conf.write_text("\n".join(sections))
        self.dirs = {m: Workdir(root, f"sv-{m}") for m in ("obedient", "stubborn")}

    def start_daemon(self) -> None:
        self.proc = subprocess.Popen(
            [str(self.bin / "supervisord"), "-c", str(self.conf)],
            stdout=subprocess.DEVNULL,
            stderr=open(self.root / "sv.err", "wb"),
            start_new_session=True,
        )
        wait_for(
            lambda: subprocess.run(self.ctl("pid"), capture_output=True).returncode == 0,
            30,
            "supervisord",
        )

    def ctl(self, *args: str) -> list[str]:
        return [str(self.bin / "supervisorctl"), "-c", str(self.conf), *args]

    def start(self, mode: str) -> None:
        subprocess.run(self.ctl("start", f"{mode}:*"), stdout=subprocess.DEVNULL, timeout=120)

    def stop(self, mode: str) -> None:
        subprocess.run(self.ctl("stop", f"{mode}:*"), stdout=subprocess.DEVNULL, timeout=120)

    def status_argv(self) -> list[str]:
        return self.ctl("status")

    def daemon_pid(self) -> int:
        return self.proc.pid

    def shutdown(self) -> None:
        subprocess.run(self.ctl("shutdown"), capture_output=True, timeout=120)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# -- ccsup -----------------------------------------------------------------------------------------


class Ccsup:
    name = "ccsup"

    def __init__(self, root: Path, worker: Path, n: int, key: str = "bench"):
        self.root, self.worker, self.n, self.key = root, worker, n, key
        self.state = root / f"ccsup-{key}"
        self.state.mkdir(mode=0o700)
        self.conf = root / f"ccsup-{key}.toml"
        self.conf.write_text(
            f'[slots]\ncaps = {{ {key} = {n} }}\n[guard]\ngrace = "1s"\nscan = "2s"\n'
        )
        self.dirs = {m: Workdir(root, f"ccsup-{key}-{m}") for m in ("obedient", "stubborn")}
        self.ids: list[str] = []

    def start_daemon(self) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "supervisor",
                "--state-dir",
                str(self.state),
                "--config",
                str(self.conf),
                "start",
                "--foreground",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(self.root / f"ccsup-{self.key}.err", "wb"),
            start_new_session=True,
            cwd=ROOT,
        )
        wait_for(self._answers, 30, "ccsup daemon")
        self.client = Client(self.state, timeout=30)
        self.sub = self.client.subscribe("turn.")
        self.pub = connected_publisher(self.client)  # as a sidecar's: connected long before

    def _answers(self) -> bool:
        try:
            with Client(self.state, timeout=1) as c:
                c.status()
            return True
        except Exception:  # not up yet: any failure means "try again"
            return False

    def start(self, mode: str) -> None:
        """N `request.turn` on the bus in one burst, as sidecars send them (circus and supervisord
        each take one command for the N)."""
        self.ids = []
        argv = ["/bin/sh", str(self.worker), mode, str(self.dirs[mode].path)]
        for _ in range(self.n):
            turn_id = uuid.uuid4().hex
            request_turn(self.pub, turn_id, self.key, argv)
            self.ids.append(turn_id)

    def stop(self, mode: str) -> None:
        for turn_id in self.ids:
            self.client.cancel(turn_id)
        self.wait_released(set(self.ids), 120)

    def wait_released(self, ids: set[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while ids:
            event = self.sub.recv(max(0.0, deadline - time.monotonic()))
            if event is None:
                raise SystemExit(
                    f"compare: ccsup turns not released in {timeout}s: {len(ids)} left"
                )
            topic, body = event
            if topic.endswith(".released") or topic.endswith(".cancelled"):
                ids.discard(body["id"])

    def status_argv(self) -> list[str]:
        return [
            str(Path(sys.executable).parent / "ccsup"),
            "--state-dir",
            str(self.state),
            "status",
        ]

    def daemon_pid(self) -> int:
        return self.proc.pid

    def guards_mib(self) -> tuple[float, float]:
        """The guards' (and their zygote's) summed RSS (shared pages counted in each) and USS (pages
        each alone owns). Guards are the zygote's children, so the daemon's descendants are walked;
        the turns' own processes (not Python) are left out."""
        rss = uss = 0.0
        for child in psutil.Process(self.proc.pid).children(recursive=True):
            if not child.name().startswith(("python", "ccsup-guard")):  # guards name themselves
                continue
            info = child.memory_full_info()
            rss, uss = rss + info.rss / 2**20, uss + info.uss / 2**20
        return rss, uss

    def shutdown(self) -> None:
        self.pub.close()
        self.sub.close()
        self.client.close()
        subprocess.run(
            self.status_argv()[:-1] + ["stop", "--timeout", "60"], capture_output=True, timeout=90
        )
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# -- the figures -----------------------------------------------------------------------------------


def measure(system, n: int, figures: dict) -> None:
    """Start, RSS, status, stop for obedient workers, then start and stop the stubborn ones."""
    name = system.name
    system.start_daemon()
    try:
        ob = system.dirs["obedient"]
        t0 = time.monotonic()
        system.start("obedient")
        ob.wait_started(n, stubborn=False)
        figures["start"][name] = round(time.monotonic() - t0, 3)
        figures["rss"][name] = round(rss_mib(system.daemon_pid()), 1)
        if isinstance(system, Ccsup):
            rss, uss = system.guards_mib()
            figures["rss"]["ccsup_guards_rss_sum"] = round(rss, 1)
            figures["rss"]["ccsup_guards_uss_sum"] = round(uss, 1)
        figures["status"][name] = round(
            statistics.median(timed(system.status_argv()) for _ in range(5)) * 1000, 1
        )
        t0 = time.monotonic()
        system.stop("obedient")
        wait_for(lambda: not ob.running(ob.up()), 60, f"{name} obedient workers gone")
        figures["stop_obedient"][name] = round(time.monotonic() - t0, 3)

        st = system.dirs["stubborn"]
        system.start("stubborn")
        st.wait_started(n, stubborn=True)
        t0 = time.monotonic()
        system.stop("stubborn")
        wait_for(lambda: not st.running(st.up()), 60, f"{name} stubborn workers gone")
        figures["stop_stubborn"][name] = round(time.monotonic() - t0, 3)
        time.sleep(0.5)  # a grandchild about to die gets its chance: count only the ones that stay
        figures["containment"][name] = len(st.running(st.grandchildren()))
    finally:
        system.shutdown()
        for workdir in system.dirs.values():
            workdir.remember()
            workdir.kill_survivors()


def throughput(root: Path, turns: int, cap: int) -> dict:
    plain_t0 = time.monotonic()
    sem = threading.Semaphore(cap)

    def one(_):
        with sem:
            subprocess.run(["sleep", "0.05"])

    with ThreadPoolExecutor(cap) as pool:
        list(pool.map(one, range(turns)))
    plain = time.monotonic() - plain_t0

    system = Ccsup(root, root / "worker.sh", cap, key="tp")
    system.start_daemon()
    try:
        ids = [uuid.uuid4().hex for _ in range(turns)]
        t0 = time.monotonic()
        for turn_id in ids:
            system.client.turn("tp", ["sleep", "0.05"], id=turn_id)
        system.wait_released(set(ids), 300)
        ccsup = time.monotonic() - t0
    finally:
        system.shutdown()
    return {
        "figure": f"{turns} turns of sleep 0.05 at cap {cap} (s)",
        "ccsup": round(ccsup, 3),
        "plain_semaphore": round(plain, 3),
        "ideal": round(turns * 0.05 / cap, 3),
        "ratio": round(ccsup / plain, 2),
    }


def kill_marked() -> int:
    """Anything this run started that still runs, by pid (identity from /proc), never by name."""
    killed = 0
    for ident in procs.processes_with_env(MARKER, RUN):
        if ident.pid != os.getpid() and procs.signal_process(ident, signal.SIGKILL):
            killed += 1
    return killed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=50)
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--cap", type=int, default=4)
    parser.add_argument("--dir", default="/tmp", help="where the run's files go (see bench_scale)")
    opts = parser.parse_args()
    bin_dir = ensure_anchors()
    os.environ[MARKER] = RUN
    root = Path(tempfile.mkdtemp(prefix="ccsup-cmp-", dir=opts.dir))
    worker = root / "worker.sh"
    worker.write_text(WORKER)
    figures = {
        k: {} for k in ("containment", "stop_stubborn", "stop_obedient", "start", "rss", "status")
    }
    try:
        for system in (
            Circus(bin_dir, root, worker, opts.n),
            Supervisord(bin_dir, root, worker, opts.n),
            Ccsup(root, worker, opts.n),
        ):
            measure(system, opts.n, figures)
        tp = throughput(root, opts.turns, opts.cap)
    finally:
        leftovers = kill_marked()
        shutil.rmtree(root, ignore_errors=True)
    n = opts.n
    lines = [
        {
            "figure": f"containment: grandchildren left running of {n} (setsid, SIGTERM ignored, grace 1s)",
            **figures["containment"],
        },
        {
            "figure": f"stop latency (s), {n} with stubborn grandchildren",
            **figures["stop_stubborn"],
        },
        {"figure": f"stop latency (s), {n} obeying SIGTERM", **figures["stop_obedient"]},
        {"figure": f"start {n} until all run (s)", **figures["start"]},
        tp,
        {"figure": f"daemon RSS (MiB) with {n} running", **figures["rss"]},
        {"figure": "status round trip through the CLI (ms, median of 5)", **figures["status"]},
        {"figure": "clean-up", "killed_by_marker_at_end": leftovers},
    ]
    for line in lines:
        print(json.dumps(line))


if __name__ == "__main__":
    main()
