"""The page marks adopted turns: a holder's `adopted_at` and `adoption_gap_s`
(the badge in the running list) come from `ps` when it says them, else from the turn's
`turn.<id>.adopted` event on the bus; a turn's bar carries them too, from the bus or the history
(its page shows "adopted ... after a gap of ...")."""

from __future__ import annotations

from supervisor.history import db as history
from supervisor.history import writer as history_writer
from supervisor.web.live import Live
from supervisor.web.timeline import past_turn

GUARD = {"pid": 5, "start": 6}


def ev(live: Live, topic: str, ts: float, **body) -> bool:
    return live.apply_event(topic, {"v": 1, "ts": ts, **body})


def slot(turn: str, index: int, **more) -> dict:
    return {
        "key": "k",
        "index": index,
        "cap": 3,
        "state": "held",
        "turn": turn,
        "since": 1.0,
        **more,
    }


def test_a_holder_is_marked_adopted_from_ps_or_else_from_its_adopted_event():
    live = Live(clock=lambda: 100.0)
    # "bus": a new supervisor's turn, known to this page only from its adoption onwards
    assert ev(live, "turn.bus.adopted", 50.0, id="bus", key="k", index=1, guard=GUARD, gap_s=1.25)
    ev(live, "turn.plain.queued", 40.0, id="plain", key="k")
    ev(live, "turn.plain.granted", 41.0, id="plain", key="k", index=2)
    live.apply_ps(
        {
            "slots": [
                slot("ps", 0, adopted_at=60.0, adoption_gap_s=0.5),  # ps says it
                slot("bus", 1),  # an older ps: no such fields
                slot("plain", 2, adopted_at=None, adoption_gap_s=None),
            ],
            "waits": [],
        }
    )
    holders = {h["turn"]: h for h in live.state()["holders"]}
    assert (holders["ps"]["adopted_at"], holders["ps"]["adoption_gap_s"]) == (60.0, 0.5)
    assert (holders["bus"]["adopted_at"], holders["bus"]["adoption_gap_s"]) == (50.0, 1.25)
    assert (holders["plain"]["adopted_at"], holders["plain"]["adoption_gap_s"]) == (None, None)
    view = live.turn("bus")
    assert view is not None and view["active"] is True
    assert view["bar"]["outcome"] == "running" and view["bar"]["adopted_at"] == 50.0
    assert [e["topic"] for e in view["events"]] == ["turn.bus.adopted"]
    # "plain" was adopted while this page was not subscribed: ps tells, its bar says so too
    live.apply_ps({"slots": [slot("plain", 2, adopted_at=80.0, adoption_gap_s=3.0)], "waits": []})
    plain = live.turn("plain")["bar"]
    assert (plain["adopted_at"], plain["adoption_gap_s"]) == (80.0, 3.0)
    ev(live, "turn.bus.adopted", 70.0, id="bus", key="k", index=1, guard=GUARD, gap_s=0.75)
    bar = live.turn("bus")["bar"]
    assert (bar["adopted_at"], bar["adoption_gap_s"]) == (70.0, 2.0)  # the last, all the gaps


def test_a_past_turns_page_says_it_was_adopted_from_the_history(tmp_path):
    db = history_writer.open_writer(history.history_path(tmp_path))
    for topic, ts, body in [
        ("turn.old.queued", 10.0, {"key": "codex"}),
        ("turn.old.granted", 12.0, {"key": "codex", "index": 0}),
        ("turn.old.started", 12.1, {"key": "codex", "guard": GUARD}),
        ("turn.old.adopted", 20.0, {"key": "codex", "index": 0, "guard": GUARD, "gap_s": 1.5}),
        ("turn.old.exited", 25.0, {"key": "codex", "code": 0, "signal": None}),
        ("turn.old.released", 25.5, {"key": "codex", "index": 0}),
    ]:
        db.execute("BEGIN")
        history_writer.apply_event(db, topic, {"v": 1, "ts": ts, "id": "old", **body})
        db.execute("COMMIT")
    db.close()
    view = past_turn(tmp_path, "old")
    assert view is not None and view["bar"] is not None
    assert (view["bar"]["adopted_at"], view["bar"]["adoption_gap_s"]) == (20.0, 1.5)
    assert "turn.old.adopted" in [e["topic"] for e in view["events"]]
