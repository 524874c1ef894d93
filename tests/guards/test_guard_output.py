"""The guard keeps the turn's output (guardd.output): what CMD writes after its supervisor died
(SIGKILL, as the OOM killer would) still reaches the turn's logs, and CMD is never killed by a
broken pipe for writing it."""

from __future__ import annotations

import json
import signal

import pytest
from conftest import wait_until

# On SIGTERM (the guard's, once its supervisor is gone) it writes to both streams, then exits 0.
SCRIPT = (
    "trap 'echo out after; echo err after >&2; exit 0' TERM; "
    "echo ready; while :; do sleep 0.05; done"
)


@pytest.mark.timeout(60)
def test_output_written_after_the_supervisor_is_killed_reaches_the_logs(daemon, state_dir):
    d = daemon(grace="5s")
    with d.client() as client:
        client.turn("codex", ["sh", "-c", SCRIPT], id="t")
    turn_dir = state_dir / "turns" / "t"
    stdout, stderr = turn_dir / "stdout.log", turn_dir / "stderr.log"
    wait_until(lambda: stdout.exists() and stdout.read_bytes() == b"ready\n", what="ready")
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait()

    def record() -> dict | None:
        for path in (state_dir / "guards").glob("*.json"):
            data = json.loads(path.read_text())
            if data["turn"] == "t" and data["state"] == "gone":
                return data
        return None

    ended = wait_until(record, what="the guard's record saying gone")
    # CMD ran its trap to the end: no SIGPIPE (141) for writing after its supervisor died.
    assert ended["exit"] == {"code": 0, "signal": None}
    assert ended["reason"] == "parent_gone"
    assert stdout.read_bytes() == b"ready\nout after\n"
    assert stderr.read_bytes().endswith(b"err after\n")  # after sh's word on its sleep's end
