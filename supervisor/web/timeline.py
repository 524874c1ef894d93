"""Where the timeline's bars and a past turn's page come from: the history, overlaid by the bus.

`recent_bars(live, since, history_bars(state_dir, since))` is what the page asks for bars: finished
turns from the supervisor's SQLite history (`supervisor.history.db`, when this ccsup has it and the file
exists) since `since`, overlaid by what this web app saw on the bus (supervisor.web.live; its bar
of a turn is the newer word). `past_turn(state_dir, id)` is a turn's page for a turn the app
never saw, from the same history. Without a history (an older supervisor, no turn run yet, a
file from a newer ccsup) both fall back to the bus alone, silently: the page then knows the turns
queued while it ran.

history_bars and past_turn read SQLite and so block: the app calls them in a worker thread. At most HISTORY_LIMIT bars
come from the history (the newest).

Knows the history's reading functions and the live model; nothing of HTTP.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

from .live import TERMINAL, Bar, EventView, Live, TurnView, leftovers_of

HISTORY_LIMIT = 5000


def _history() -> ModuleType | None:
    try:
        return importlib.import_module("supervisor.history.db")
    except ImportError:
        return None


def _bar(record: Any) -> Bar:
    holder = record.get("holder") or {}
    state = record.get("state")
    return Bar(
        id=record["id"],
        key=record["key"],
        session=holder.get("session"),
        agent=holder.get("agent"),
        queued_at=record.get("queued_at"),
        granted_at=record.get("granted_at"),
        ended_at=record.get("ended_at"),
        outcome=state
        if state in TERMINAL
        else ("running" if record.get("granted_at") else "waiting"),
        exit_code=record.get("exit_code"),
        reservation=False,
        adopted_at=record.get("adopted_at"),
        adoption_gap_s=record.get("adoption_gap_s"),
    )


def history_bars(state_dir: Path, since: float) -> list[Bar]:
    history = _history()
    if history is None:
        return []
    try:
        records = history.query(state_dir, since=since, finished=True, limit=HISTORY_LIMIT)
    except history.HistoryError:
        return []
    return [_bar(record) for record in records]


def recent_bars(live: Live, since: float, past: list[Bar]) -> list[Bar]:
    """The bars since `since`: `past` (from history_bars, read off the loop) overlaid by live's."""
    bars = {bar["id"]: bar for bar in past}
    for bar in live.bars(since):
        bars[bar["id"]] = bar
    return sorted(bars.values(), key=lambda b: b["queued_at"] or b["granted_at"] or 0.0)


def past_turn(state_dir: Path, turn_id: str) -> TurnView | None:
    """A finished turn's page from the history; None when there is none or it does not know it."""
    history = _history()
    if history is None:
        return None
    try:
        story = history.show(state_dir, turn_id)
    except history.HistoryError:
        return None
    if story is None:
        return None
    events = [
        EventView(topic=f"turn.{turn_id}.{e['kind']}", ts=e["ts"], body=e["body"])
        for e in story["events"]
    ]
    exit_info = None
    if story.get("exited_at") is not None:
        exit_info = {
            "code": story.get("exit_code"),
            "signal": story.get("signal"),
            "reason": story.get("reason"),
            **(story.get("usage") or {}),
        }
    return TurnView(
        id=turn_id,
        key=story["key"],
        bar=_bar(story),
        events=events,
        output_chunks=0,
        usage=story.get("usage") or None,
        exit=exit_info,
        active=story.get("ended_at") is None,
        leftovers=leftovers_of(story.get("leftovers")),
    )
