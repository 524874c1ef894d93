"""Size is part of correctness: `ps` answers whatever its size, and a large
cap costs what is in use, not what the cap allows. Real daemons, real sockets, real files."""

from __future__ import annotations

import json
import subprocess
import time

from conftest import PYTHON

from supervisor.wire import protocol

LABEL = "x" * 256  # the longest a holder label may be (wire.args)
CCSUP = [PYTHON, "-m", "supervisor"]


def run_ccsup(state_dir, *args, timeout=30):
    return subprocess.run(
        [*CCSUP, "--state-dir", str(state_dir), *args],
        capture_output=True,
        timeout=timeout,
    )


def test_ps_of_more_than_a_frame_answers_one_whole_document(daemon):
    """1,000 waiters with the longest labels: a `ps` of about 1.7 MiB, past the 1 MiB frame that
    every reply had to fit in (it answered "over the limit" and the page went blank)."""
    d = daemon(caps="one = 1")
    labels = {name: LABEL for name in ("session", "agent", "harness", "model", "effort", "mode")}
    with d.client(timeout=20) as client:
        client.turn("one", ["sleep", "300"], id="busy")
        for n in range(1000):
            client.turn("one", ["true"], id=f"w{n}", holder=labels)
        ps = client.ps()
        assert [w["id"] for w in ps["waits"]] == [f"w{n}" for n in range(1000)]
        assert [w["position"] for w in ps["waits"]] == list(range(1, 1001))
        assert client.status()["waits"] == 1000  # the socket still serves small replies
    done = run_ccsup(d.state_dir, "ps", "--json")
    assert done.returncode == 0, done.stderr.decode()[-500:]
    assert len(done.stdout) > protocol.MAX_FRAME  # it did not fit one frame
    printed = json.loads(done.stdout)  # one document
    assert len(printed["waits"]) == 1000 and printed["waits"][-1]["holder"]["mode"] == LABEL
    table = run_ccsup(d.state_dir, "ps")
    assert table.returncode == 0 and table.stdout.count(b"\n1000 ") == 1


def test_a_cap_of_a_million_costs_what_is_in_use(daemon):
    """Cap 1,000,000 (the maximum): the daemon starts, grants, and answers `status` and `ps` at
    once; `ps` counts the free slots instead of listing a million of them."""
    d = daemon(caps="big = 1000000")
    with d.client(timeout=5) as client:
        for n in range(3):
            client.turn("big", ["sleep", "300"], id=f"t{n}")
        deadline = time.monotonic() + 20
        while len([s for s in client.ps()["slots"] if s["key"] == "big"]) < 3:
            assert time.monotonic() < deadline, "three turns of `big` were not granted"
            time.sleep(0.05)
        started = time.monotonic()
        client.status()
        ps = client.ps()
        elapsed = time.monotonic() - started
    [tally] = [t for t in ps["slot_keys"] if t["key"] == "big"]
    assert (tally["cap"], tally["free"], tally["reserved"] + tally["held"]) == (1000000, 999997, 3)
    assert sorted(s["index"] for s in ps["slots"] if s["key"] == "big") == [0, 1, 2]
    assert len(json.dumps(ps)) < 100_000
    assert elapsed < 2.0, elapsed  # was over 20 s: a stat per index on the event loop


def test_a_cap_over_the_maximum_is_refused_naming_the_key(state_dir):
    """`--caps a=99999999999999999999` grew the daemon to 3.5 GiB; now start refuses it, exit 2."""
    done = run_ccsup(state_dir, "start", "--foreground", "--caps", "a=99999999999999999999")
    assert done.returncode == 2
    assert b"bad cap for 'a': 99999999999999999999 is over the maximum cap, 1000000" in done.stderr
    assert not (state_dir / "control").exists()  # nothing was started
    config = state_dir / "big.toml"
    config.write_text("[slots]\ncaps = { codex = 2, big = 1000001 }\n")
    checked = run_ccsup(state_dir, "--config", str(config), "config", "check")
    assert checked.returncode == 2
    assert b"slots.caps.big: a cap must be a whole number from 1 to 1000000, not 1000001" in (
        checked.stderr
    )
