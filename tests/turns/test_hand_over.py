"""A hand-over (`ccsup restart`'s old half), without processes: nothing new is taken or granted,
nothing that runs is touched, and queue.json keeps each running turn with its output's offsets."""

from __future__ import annotations

import pytest
from fakes import (
    RUN,
    no_process_left,  # noqa: F401 (an autouse fixture)
    scenario,
)

from supervisor.wire.protocol import ProtocolError


@scenario(caps={"codex": 2})
async def test_a_hand_over_saves_each_running_turn_with_its_offsets_and_ends_none(h):
    h.turn("t1")
    h.turn("t2")
    h.turn("t3")  # waits: the cap is 2
    h.guard("t1").published = {"stdout": 12, "stderr": 3}
    h.guard("t2").published = {"stdout": 0, "stderr": 70000}
    h.manager.begin_hand_over()
    assert h.manager.hand_over() == 2
    running = sorted(h.saved()["running"], key=lambda e: e["id"])
    assert [(e["id"], e["offsets"]) for e in running] == [
        ("t1", {"stdout": 12, "stderr": 3}),
        ("t2", {"stdout": 0, "stderr": 70000}),
    ]
    assert [w["id"] for w in h.saved()["waiting"]] == ["t3"]  # the next supervisor's, in order
    for turn_id in ("t1", "t2"):
        assert h.guard(turn_id).handed_over and h.guard(turn_id).terminated == 0
        assert h.events(turn_id) == RUN  # no stopping, exited, gone or released
    assert h.events("t3") == ["queued"]


@scenario(caps={"codex": 1})
async def test_once_a_hand_over_begins_nothing_new_is_taken_or_granted(h):
    h.turn("t1")
    h.turn("t2")
    h.manager.begin_hand_over()
    with pytest.raises(ProtocolError) as refused:
        h.turn("t3")
    assert refused.value.code == "stopping"
    with pytest.raises(ProtocolError) as refused:
        h.reserve("r1")
    assert refused.value.code == "stopping"
    await h.end("t1", 0)  # its slot is free now, and t2 is still not granted
    assert h.events("t2") == ["queued"]
    assert h.held() == {}
