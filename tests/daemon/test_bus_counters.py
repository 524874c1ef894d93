"""Each turn's events carry their own count, so a sidecar that follows one turn sees every loss.

Against a real supervisor: a narrow subscription (`turn.<id>.`, which watches `supervisor.` too)
receives only its turn's events, numbered 1..n by `turn_seq`, and `supervisor.turn_ended` names
the last number; events of other turns never reach it.
"""

from __future__ import annotations

import pytest
from conftest import wait_until

SCRIPT = "for i in 1 2 3 4 5; do echo line $i; done"


@pytest.mark.timeout(60)
def test_a_narrow_subscriber_gets_only_its_turn_numbered_without_holes(daemon, event_log):
    d = daemon(caps="codex = 2")
    everything = event_log(d)
    with d.client() as client:
        with client.subscribe(["turn.mine."]) as sub:
            sub.expect_turn("mine")
            client.turn("codex", ["sh", "-c", SCRIPT], id="other")
            client.turn("codex", ["sh", "-c", SCRIPT], id="mine")
            events = list(sub.until_terminal(idle_check=client.check_running))
            assert sub.gaps == 0
        everything.wait_for("turn.other.released")
    assert {t.split(".")[1] for t, _ in events} == {"mine"}
    assert [b["turn_seq"] for _, b in events] == list(range(1, len(events) + 1))
    assert events[-1][0] == "turn.mine.released" and "inferred" not in events[-1][1]
    ended = wait_until(
        lambda: (
            {b["id"]: b for b in everything.find("supervisor.turn_ended")}.keys()
            >= {"mine", "other"}
            and {b["id"]: b for b in everything.find("supervisor.turn_ended")}
        ),
        what="turn_ended for both turns",
    )
    assert ended["mine"] == ended["mine"] | {"key": "codex", "state": "released"}
    assert ended["mine"]["turn_seq"] == len(events)
    # Every supervisor.* event is numbered in its own family, without holes.
    family = [b["supervisor_seq"] for t, b, _ in everything.events if t.startswith("supervisor.")]
    assert family == list(range(family[0], family[0] + len(family)))
    # The global seq still numbers every event of the supervisor's (the guards' hints have none).
    seqs = [b["seq"] for t, b, _ in everything.events if not t.startswith("guard.")]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
