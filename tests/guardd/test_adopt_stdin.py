"""A "pipe" turn's stdin across its supervisor's death (guardd.stdin): a guard with --adopt-within
holds a writer of CMD's stdin, so CMD reads no EOF while no supervisor runs; the adopter is handed
a writer in the adopt answer and writes the turn's stdin again; the deliberate EOF (the channel's
close_stdin, then the writer's close) still reaches CMD as EOF. Started directly and through the
zygote (killed with its supervisor), by a stand-in supervisor using supervisor.guards."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT, wait_until

from guardd import channel, procs
from supervisor.guards.handle import GuardProcess, GuardSpec, _Pipes, start_guard
from supervisor.guards.launcher import Launcher, PendingGuard

ADOPT_WITHIN = 20.0  # long: a test never races the dead-man deadline
# CMD: each line of its stdin answered with a counter, then "eof" when its stdin ends.
ECHO = (
    "import sys\n"
    "n = 0\n"
    "for line in sys.stdin:\n"
    "    n += 1\n"
    "    print(n, line.strip(), flush=True)\n"
    "print('eof', flush=True)\n"
)
# A stand-in supervisor: starts the guard (directly or through a zygote), writes "one" to the
# turn's stdin, prints the guard's identity, and waits to be SIGKILLed.
SUPERVISOR = textwrap.dedent(f"""
    import asyncio, json, sys
    from pathlib import Path
    sys.path.insert(0, {str(ROOT)!r})
    from supervisor.guards.handle import GuardSpec, start_guard
    from supervisor.guards.launcher import Launcher, PendingGuard

    async def main(how, tmp):
        loop = asyncio.get_running_loop()
        spec = GuardSpec(
            "t1", [sys.executable, "-c", {ECHO!r}], cwd=None, env={{}},
            record_dir=Path(tmp) / "guards", grace=0.3, scan=1.0, bus=None,
            log_dir=Path(tmp) / "logs", adopt_within={ADOPT_WITHIN!r},
        )
        zygote = None
        if how == "zygote":
            launcher = Launcher(restart_after=600)
            launcher.start()
            zygote = launcher.zygote.pid
            guard = launcher.start_guard(spec)
            assert isinstance(guard, PendingGuard), guard
            future = loop.create_future()
            guard.then(future.set_result)
            guard = await future
        else:
            guard = start_guard(spec)
        guard.attach(loop, Path(tmp) / "logs", on_output=lambda *a: None, on_exit=lambda: None)
        guard.write_stdin(b"one\\n")
        ident = {{"pid": guard.pid, "start": guard.identity.start, "zygote": zygote}}
        print(json.dumps(ident), flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main(*sys.argv[1:]))
""")


def log_lines(tmp_path: Path) -> list[str]:
    path = tmp_path / "logs" / "stdout.log"
    return path.read_text().splitlines() if path.exists() else []


def record_of(tmp_path: Path, guard: procs.Identity) -> dict | None:
    try:
        return json.loads((tmp_path / "guards" / f"{guard.pid}-{guard.start}.json").read_text())
    except (FileNotFoundError, ValueError):
        return None


def orphaned_turn(tmp_path: Path, how: str, cleanup: list) -> tuple[procs.Identity, dict]:
    """A turn whose stand-in supervisor read "1 one" back and was then SIGKILLed (its zygote
    too, through the zygote): the guard and CMD, waiting to be adopted. Returns the guard's
    identity and its record."""
    (tmp_path / "logs").mkdir()
    parent = subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR, how, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    cleanup.append(parent)
    started = json.loads(parent.stdout.readline())
    guard = procs.Identity(started["pid"], started["start"])
    cleanup.append(guard)
    first = wait_until(lambda: record_of(tmp_path, guard), what="the guard's record")
    cmd = procs.identity_of(first["own_group"]["pgid"])
    assert cmd is not None
    cleanup.append(cmd)
    wait_until(lambda: log_lines(tmp_path) == ["1 one"], what="CMD's answer to the first line")
    parent.kill()  # the supervisor dies outright (and its zygote with it, watching it)
    parent.wait()
    if started["zygote"] is not None:
        zygote = procs.Identity(started["zygote"], procs.start_ticks(started["zygote"]) or 0)
        wait_until(lambda: not procs.process_running(zygote), what="the zygote's end")
    waiting = wait_until(
        lambda: (r := record_of(tmp_path, guard)) and r["waiting_since"] is not None and r,
        what="the guard waiting to be adopted",
    )
    assert procs.process_running(cmd)
    return guard, waiting


def finished(tmp_path: Path, guard: procs.Identity) -> dict:
    return wait_until(
        lambda: (r := record_of(tmp_path, guard)) and r["state"] == "gone" and r,
        timeout=10,
        what="the guard's end",
    )


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["direct", "zygote"])
def test_cmd_reads_no_eof_while_orphaned_and_the_adopter_writes_its_stdin(tmp_path, how, cleanup):
    guard, waiting = orphaned_turn(tmp_path, how, cleanup)
    path = waiting["channel"]["path"]
    answer = channel.adopt(path)
    assert answer["ok"] is True and answer["stdin"] is True
    fd = answer["stdin_fd"]
    assert isinstance(fd, int)
    try:
        os.write(fd, b"two\n")
        # Had CMD read EOF when its supervisor died, its loop would be over: no "2 two".
        wait_until(lambda: log_lines(tmp_path) == ["1 one", "2 two"], what="CMD's second answer")
        channel.close_stdin(path)  # the deliberate EOF: the guard's writer, then ours
    finally:
        os.close(fd)
    final = finished(tmp_path, guard)
    assert log_lines(tmp_path) == ["1 one", "2 two", "eof"]
    assert (final["reason"], final["exit"]["code"]) == ("exited", 0)


@pytest.mark.timeout(60)
def test_an_adopting_guard_process_takes_the_stdin_and_its_eof_reaches_cmd(tmp_path, cleanup):
    guard, waiting = orphaned_turn(tmp_path, "zygote", cleanup)
    answer = channel.adopt(waiting["channel"]["path"])
    assert answer["ok"] is True

    async def adopted() -> None:
        ended = asyncio.Event()
        process = GuardProcess(
            "t1",
            _Pipes(guard.pid, -1, -1, -1),
            tmp_path / "guards",
            stdio=(-1, -1, -1),
            start=guard.start,
        )
        process.take_stdin(answer["stdin_fd"])
        process.attach(
            asyncio.get_running_loop(),
            tmp_path / "logs",
            on_output=lambda *a: None,
            on_exit=ended.set,
        )
        process.write_stdin(b"two\n")
        process.write_stdin(b"three\n", eof=True)
        await asyncio.wait_for(ended.wait(), 20)
        process.close()

    asyncio.run(adopted())
    assert log_lines(tmp_path) == ["1 one", "2 two", "3 three", "eof"]
    assert finished(tmp_path, guard)["exit"]["code"] == 0


@pytest.mark.timeout(30)
@pytest.mark.parametrize("how", ["direct", "zygote"])
def test_with_adopt_within_a_deliberate_eof_still_ends_cmds_stdin(tmp_path, how):
    """No gap at all: the guard's writer must not keep a `send` with eof from reaching CMD, even
    one sent before the guard is up."""
    (tmp_path / "logs").mkdir()
    spec = GuardSpec(
        "t1",
        [sys.executable, "-c", ECHO],
        cwd=None,
        env={},
        record_dir=tmp_path / "guards",
        grace=0.3,
        scan=1.0,
        bus=None,
        log_dir=tmp_path / "logs",
        adopt_within=ADOPT_WITHIN,
    )

    async def run() -> tuple[bool, int | None]:
        loop = asyncio.get_running_loop()
        launcher = Launcher(restart_after=600) if how == "zygote" else None
        if launcher is not None:
            launcher.start()
            pending = launcher.start_guard(spec)
            assert isinstance(pending, PendingGuard)
            future = loop.create_future()
            pending.then(future.set_result)
            guard = await future
        else:
            guard = start_guard(spec)
        ended = asyncio.Event()
        guard.attach(loop, tmp_path / "logs", on_output=lambda *a: None, on_exit=ended.set)
        held = guard.stdin_held
        # At once: the guard may not have made its channel yet, and must still hear the EOF.
        guard.write_stdin(b"only\n", eof=True)
        try:
            await asyncio.wait_for(ended.wait(), 10)
        finally:
            if not ended.is_set():
                os.kill(guard.pid, signal.SIGKILL)
                await asyncio.wait_for(ended.wait(), 10)
            status = guard.reap()
            guard.close()
            if launcher is not None:
                launcher.close()
        return held, status

    held, status = asyncio.run(run())
    assert held and status == 0
    assert log_lines(tmp_path) == ["1 only", "eof"]


def ask(path: str, message: dict) -> dict:
    """One op on the channel, its answer read (the supervisor's close_stdin does not wait)."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
        sock.settimeout(5)
        sock.connect(path)
        sock.send(json.dumps(message).encode())
        return json.loads(sock.recv(4096))


@pytest.mark.timeout(30)
def test_a_guard_whose_stdin_is_not_a_pipe_hands_none_and_close_stdin_is_still_answered(
    tmp_path, cleanup
):
    guard_proc = subprocess.Popen(
        [sys.executable, "-m", "guardd", "--record-dir", str(tmp_path / "guards")]
        + ["--grace", "0.3", "--adopt-within", "20s", "--", "sleep", "60"],
        stdin=subprocess.DEVNULL,  # a "null" turn's
    )
    cleanup.append(guard_proc)
    guard = procs.identity_of(guard_proc.pid)
    assert guard is not None
    first = wait_until(lambda: record_of(tmp_path, guard), what="the guard's record")
    cleanup.append(procs.identity_of(first["own_group"]["pgid"]))
    path = first["channel"]["path"]
    assert ask(path, {"v": 1, "op": "close_stdin"}) == {"v": 1, "ok": True}  # nothing to close
    refused = ask(path, {"v": 1, "op": "open_stdin"})
    assert refused["ok"] is False and refused["error"] == "unknown op 'open_stdin'"
    answer = channel.adopt(path)  # its parent (this test) still runs: adopted all the same
    assert (answer["ok"], answer["stdin"], answer["stdin_fd"]) == (True, False, None)
    guard_proc.terminate()
    assert guard_proc.wait(10) == 128 + signal.SIGTERM
