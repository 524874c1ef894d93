"""What an agent sees of `ccsup run`: its harness reads the command's stdout
and stderr through pipes, often one pipe for both (2>&1). The merged output keeps the order the
command wrote in (as the guard's reads of the two pipes timed it, the logs' .idx files), and a
supervisor's death and return are not announced inside it (only on a terminal, or --notices)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from conftest import wait_until

CCSUP = [sys.executable, "-m", "supervisor"]
LINES = 300
# Each line written and flushed 1 ms after the one before (a read of its own for the guard): the
# order is what the read times say.
ALTERNATING = [
    sys.executable,
    "-c",
    "import sys, time\n"
    f"for i in range(1, {LINES + 1}):\n"
    "    for out, name in ((sys.stdout, 'out'), (sys.stderr, 'err')):\n"
    "        out.write(f'{name} {i}\\n'); out.flush(); time.sleep(0.001)\n",
]


def written() -> bytes:
    return b"".join(f"out {i}\nerr {i}\n".encode() for i in range(1, LINES + 1))


@pytest.mark.timeout(60)
def test_stdout_and_stderr_into_one_pipe_keep_the_written_order(daemon, state_dir):
    d = daemon(caps="default = 1")
    env = dict(os.environ, CCSUP_STATE_DIR=str(state_dir), CCSUP_CONFIG=str(d.config))
    done = subprocess.run(
        [*CCSUP, "run", "--", *ALTERNATING],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # 2>&1: one pipe, as a harness's Bash tool reads it
        timeout=50,
    )
    assert done.returncode == 0, done.stdout
    # The order the guard's reads say (its .idx times): exact, whatever the load. Writes closer
    # together than one of its reads come out in its read order, so on a quiet machine this is
    # the written order (and the bus's order was not: a batch of one stream before the other).
    assert done.stdout == by_read_times(state_dir)
    assert sorted(done.stdout.splitlines()) == sorted(written().splitlines())


def by_read_times(state_dir) -> bytes:
    from supervisor.output.line_times import read_index

    (turn,) = os.listdir(state_dir / "turns")
    pieces = []
    for n, stream in enumerate(("stdout", "stderr")):
        log = (state_dir / "turns" / turn / f"{stream}.log").read_bytes()
        entries = read_index(state_dir / "turns" / turn / f"{stream}.idx")
        for i, (offset, at) in enumerate(entries):
            end = entries[i + 1][0] if i + 1 < len(entries) else len(log)
            pieces.append((at, n, log[offset:end]))
    return b"".join(data for _, _, data in sorted(pieces))


@pytest.mark.timeout(90)
def test_ride_through_notices_stay_out_of_a_piped_output(daemon, state_dir, tmp_path):
    d = daemon(adopt_within="30s")
    env = dict(os.environ, CCSUP_STATE_DIR=str(state_dir), CCSUP_CONFIG=str(d.config))
    go = tmp_path / "go"
    out = tmp_path / "merged"
    script = f"echo before; while [ ! -e {go} ]; do sleep 0.05; done; echo after"
    with open(out, "wb") as merged:
        run = subprocess.Popen(
            [*CCSUP, "run", "--key", "codex", "--", "sh", "-c", script],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=merged,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(lambda: b"before" in out.read_bytes(), 20, what="the turn's first line")
        d.kill()
        time.sleep(1.0)  # the gap
        d.start()
        go.write_text("")
        code = run.wait(40)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert code == 0, out.read_text()
    assert out.read_bytes() == b"before\nafter\n"
