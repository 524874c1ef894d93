"""The supervisor's memory stays bounded whatever a client or a turn does: a
suspended subscriber while a turn writes 150 MB, and sends to a turn that does not read its stdin.
The longer runs, against the unbounded behaviour, are tests/bench/bench_memory.py."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import textwrap

import pytest
from conftest import PYTHON, wait_until

from guardd import procs
from supervisor.client.control import RemoteError
from supervisor.turns.manager import STDIN_MAX_PENDING

MiB = 1 << 20


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


# A subscriber to every event that stops itself (as Ctrl-Z would) once it is live, and
# once continued, reads what was queued for it and says how much, and what it lost.
SUSPENDED_SUBSCRIBER = textwrap.dedent(
    """
    import json, os, signal, sys
    from supervisor.client import Client
    with Client(sys.argv[1], timeout=30) as client:
        sub = client.subscribe([""])  # everything: a hole in `seq` is a loss
        print("ready", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
        chunks, holes, end = 0, 0, 0
        # Until a later turn's release (the test asks one every 0.5 s: a turn that ends while the
        # queue still holds its bound of older chunks is itself lost, as it should be).
        while (event := sub.recv(60)) is not None and not (
            event[0].startswith("turn.later") and event[0].endswith(".released")
        ):
            if event[0] == "turn.t1.stdout":
                chunks += 1
                holes += event[1]["offset"] != end  # the stream's bytes from `end` were lost
                end = event[1]["offset"] + len(event[1]["data"])
        print(json.dumps({"chunks": chunks, "holes": holes, "gaps": sub.gaps}), flush=True)
    """
)


def test_a_suspended_subscriber_costs_the_supervisor_a_bounded_queue_and_sees_the_gap(
    daemon, event_log, state_dir
):
    d = daemon(caps="codex = 1")
    released = event_log(d, prefixes=("turn.t1.released",))
    sub = subprocess.Popen(
        [PYTHON, "-c", SUSPENDED_SUBSCRIBER, str(state_dir)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert sub.stdout.readline() == "ready\n"
        wait_until(lambda: procs.read_stat(sub.pid).state == "T", what="the subscriber stopped")
        before = rss(d.proc.pid)
        total = 150 * 1000 * 1000
        with d.client() as client:
            client.turn("codex", ["sh", "-c", f"yes 0123456789abcdef | head -c {total}"], id="t1")
        released.wait_for("turn.t1.released", timeout=120)
        grown = rss(d.proc.pid) - before
        # Unbounded, all 150 MB waited in the supervisor for this one subscriber.
        assert grown < 64 * MiB, f"the supervisor grew {grown / MiB:.0f} MiB"
        assert os.path.getsize(state_dir / "turns" / "t1" / "stdout.log") == total  # exact
        os.kill(sub.pid, signal.SIGCONT)
        with d.client() as client:  # later events: they show the subscriber its gap
            for i in range(60):
                client.turn("codex", ["true"], id=f"later{i}")
                if select.select([sub.stdout], [], [], 0.5)[0]:
                    break
        seen = json.loads(sub.stdout.readline())
        assert sub.wait(30) == 0
        # It lost messages past its bound, and sees where: holes in the offsets, in turn_seq.
        assert seen["gaps"] > 0 and 0 < seen["chunks"] < total // 65536, seen
    finally:
        if sub.poll() is None:
            os.kill(sub.pid, signal.SIGCONT)
            sub.kill()
            sub.wait()
        sub.stdout.close()


def test_sends_to_a_turn_that_does_not_read_are_refused_busy_past_the_bound_and_none_lost(
    daemon, event_log, state_dir
):
    d = daemon(caps="codex = 1")
    log = event_log(d, prefixes=("turn.t1.",))
    go = state_dir / "go"
    # It reads nothing until told to, then counts every byte of its stdin.
    reader = f"while [ ! -e {go} ]; do sleep 0.05; done; exec wc -c"
    piece = "x" * 900_000
    with d.client() as client:
        client.turn("codex", ["sh", "-c", reader], id="t1")
        log.wait_for("turn.t1.started")
        before = rss(d.proc.pid)
        taken, refused = 0, 0
        for _ in range(200):  # 180 MB offered; unbounded, the supervisor held all of it
            try:
                reply = client.send("t1", piece)
            except RemoteError as e:
                assert e.code == "busy" and "has not read yet" in e.message, e
                refused += 1
                continue
            taken += reply["written"]
            assert reply["pending"] <= STDIN_MAX_PENDING
        grown = rss(d.proc.pid) - before
        assert refused > 0 and taken <= STDIN_MAX_PENDING + (1 << 20), (taken, refused)
        assert grown < 24 * MiB, f"the supervisor grew {grown / MiB:.0f} MiB"
        client.send("t1", "", eof=True)  # an empty send is never busy
        go.touch()
        log.wait_for("turn.t1.released", timeout=30)
    # Every byte taken reached the turn, and nothing refused did.
    counted = (state_dir / "turns" / "t1" / "stdout.log").read_text().strip()
    assert int(counted) == taken


@pytest.fixture(autouse=True)
def _enough_disk(state_dir):
    if os.statvfs(state_dir).f_bavail * os.statvfs(state_dir).f_frsize < 400 * MiB:
        pytest.skip("needs 400 MiB free beside the state directory for the turn's log")
