"""The timeline's source: the turns of a recent window, one bar each (queued, granted, ended).

`recent_bars(live, since)` is the one function the page asks. Today it answers from what this web
app saw on the bus (supervisor.web.live), so it knows only turns that were queued while it ran
(plus those `ps` shows now). When the supervisor's SQLite history (`ccsup history`) is on main,
this function is where finished turns from before the app started come in: rows from history
since `since`, overlaid by the live bars of the same id (the live one is newer).

Knows where bars come from; nothing of HTTP.
"""

from __future__ import annotations

from .live import Bar, Live


def recent_bars(live: Live, since: float) -> list[Bar]:
    return live.bars(since)
