"""Load with faults: clients submit, cancel and reserve hundreds of turns at cap 3 while guards and
once the supervisor itself are SIGKILLed. Nothing is lost, the cap holds, nothing is left."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time

import pytest
from conftest import HELPERS, PYTHON, leftovers, wait_until

from guardd import procs

CLIENTS = 3
# Short in the suite; CCSUP_SOAK_SECONDS=300 for a long one.
SECONDS = float(os.environ.get("CCSUP_SOAK_SECONDS") or 10.0)
TERMINAL = (".released", ".cancelled", ".rejected")


def describe(client, d) -> str:
    """What a person needs when the soak does not settle: the slots, the queue, the daemon's log."""
    ps = client.ps()
    slots = [(s["index"], s["state"], s["turn"], s["pid"]) for s in ps["slots"]]
    log_tail = "\n".join(d.stderr_path.read_text().splitlines()[-20:])
    return f"{len(ps['waits'])} waiting; slots {slots}\n{log_tail}"


@pytest.mark.timeout(180)
def test_soak_with_guards_and_the_supervisor_killed(daemon, event_log, state_dir):
    d = daemon(caps="soak = 3", grace="200ms", scan="100ms", extra='reservation_ttl = "500ms"')
    log = event_log(d)
    counts = state_dir / "counts"
    # An independent witness of the cap: three token files. A starting turn takes the first token
    # it can lock (LOCK_EX|LOCK_NB, never waiting) and keeps it for its whole life, its children
    # included; the kernel drops it when the work dies, however it dies. A fourth turn at once
    # would find no free token and say so.
    tokens = " ".join(str(state_dir / f"token{i}") for i in range(3))
    turn_cmd = [
        "sh",
        "-c",
        f'for t in {tokens}; do exec 9>>"$t"; if flock -n -x 9; then echo "ok $CCSUP_TURN" >> {counts}; '
        f'exec sleep 0.3; fi; exec 9>&-; done; echo "over $CCSUP_TURN" >> {counts}; sleep 0.3',
    ]
    client_script = str(HELPERS / "soak_client.py")
    clients = [
        subprocess.Popen([PYTHON, client_script, str(state_dir), str(n), str(SECONDS), *turn_cmd])
        for n in range(CLIENTS)
    ]
    rng = random.Random(7)
    guards_killed, supervisor_killed = 0, False
    started_at = time.monotonic()
    try:
        while any(c.poll() is None for c in clients):
            time.sleep(rng.uniform(0.1, 0.4))
            if not supervisor_killed and time.monotonic() - started_at > SECONDS * 0.4:
                d.kill()
                supervisor_killed = True
                time.sleep(0.3)
                d.start()
                continue
            running = [
                b
                for t, b in [(t, b) for t, b, _ in list(log.events)]
                if t.startswith("turn.") and t.endswith(".started")
            ]  # not supervisor.started
            done = {t.split(".")[1] for t in log.topics("turn.") if t.endswith(TERMINAL)}
            live = [b for b in running if b["id"] not in done]
            if live:
                victim = rng.choice(live)["guard"]
                if procs.signal_process(
                    procs.Identity(victim["pid"], victim["start"]), signal.SIGKILL
                ):
                    guards_killed += 1
    finally:
        for c in clients:
            if c.wait(60) != 0:
                pytest.fail(f"a soak client exited {c.returncode}")

    with d.client(timeout=5) as client:

        def settled() -> bool:
            status = client.status()
            return not (status["turns"] or status["waits"] or status["reservations"])

        try:
            wait_until(settled, 60, 0.05)
        except TimeoutError:
            pytest.fail(f"not everything ended: {client.status()} {describe(client, d)}")
        acked = []
        for n in range(CLIENTS):
            acked += [line.split() for line in (state_dir / f"acked-{n}").read_text().splitlines()]
        states = {}
        for item_id, kind in acked:
            if kind == "turn":
                states[item_id] = client.turn("soak", turn_cmd, id=item_id)["state"]
            else:
                states[item_id] = client.reserve("soak", id=item_id)["state"]
        assert set(states.values()) <= {"released", "cancelled", "rejected"}, states
        assert all(s["state"] == "free" for s in client.ps()["slots"])

    terminal_events: dict[str, int] = {}
    for topic in log.topics("turn."):
        if topic.endswith(TERMINAL):
            terminal_events[topic.split(".")[1]] = terminal_events.get(topic.split(".")[1], 0) + 1
    assert max(terminal_events.values()) == 1  # never two ends for one request
    starts = counts.read_text().splitlines()
    assert [line for line in starts if not line.startswith("ok ")] == []  # never a fourth at once
    d.stop()
    log.close()
    assert leftovers() == []
    print(
        json.dumps(
            {
                "soak_requests": len(acked),
                "turns_started": len(starts),
                "guards_killed": guards_killed,
                "supervisor_killed": int(supervisor_killed),
                "terminal_events_seen": sum(terminal_events.values()),
                "states": {s: list(states.values()).count(s) for s in set(states.values())},
            }
        )
    )
    assert len(starts) >= 100 and guards_killed >= 5
