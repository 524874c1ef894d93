"""A turn whose start fails half-way ends with its one terminal event and frees its slot (real daemon).

The fault is real: the turn's log directory path is taken by a file, so it cannot be made. Before
the fix the guard was started first and the failure came after, leaving the turn granted with a
running guard nobody watched (and the request answered with an internal error).
"""

from __future__ import annotations


def test_a_turn_whose_log_directory_cannot_be_made_ends_and_frees_its_slot(
    daemon, event_log, state_dir
):
    d = daemon(caps="codex = 1")
    log = event_log(d)
    (state_dir / "turns" / "t1").write_text("in the way")
    with d.client() as client:
        assert client.turn("codex", ["sleep", "300"], id="t1")["state"] == "released"
        log.wait_for("turn.t1.released")
        assert log.topics("turn.t1.") == [
            f"turn.t1.{e}" for e in ("queued", "granted", "exited", "gone", "released")
        ]
        reason = log.find("turn.t1.exited")[0]["reason"]
        assert reason.startswith("unable to create the turn's log directory")
        assert reason.endswith("File exists")
        events = list(client.run_turn("codex", ["true"], id="t2"))
        assert events[-1][0] == "turn.t2.released"
        assert client.ps()["slots"] == []  # nothing taken
    d.stop()  # spent guard records are removed off the event loop: by the time it has stopped
    assert not list((state_dir / "guards").iterdir())  # no guard was ever started for t1
