"""The order of a key's waiters: "fifo" (request order) or "session" (round-robin by session).

Design note. The wait queue sorts each key's waiters by a rank this module gives at enqueue time;
the head is granted first and nobody behind it jumps ahead. `fifo` ranks by (request time, id),
as ccsup always did. `session` is start-time fair queueing with equal weights: every waiter gets a
round number `tag`, one more than the last tag of its session, but never below the key's current
round (the tag of the waiter granted last); waiters are ranked by (tag, request time, id). So a
session that queued fifty turns has them in rounds 0..49, and a person's single turn that arrives
while round 3 is served gets round 3: it is granted after at most one more turn of each other
session, never behind all fifty. A session that comes back after being idle starts at the current
round: it earns no credit for the time it waited nothing. Rejected: a plain rotation of sessions
(a new session joins behind the one just served and waits a full turn too long), and counting
grants per session since the start (a new session would then overtake old ones for as long as
they had been served).

A waiter's session is its holder's `session` label, else its requester's pid, else the waiter is
a session of its own (anonymous waiters stay in request order among themselves).

State: ranks are not saved; a restarted supervisor re-adds the waiters in their old order, which
gives them the same relative rounds up to where the current round stood (round 0 again).
Knows ranks; nothing of slots, turns' states or time.
"""

from __future__ import annotations

from typing import Protocol

from ..config.admission import FAIRNESS

Rank = tuple  # what a key's waiters are sorted by


class Ordering(Protocol):
    def rank(self, key: str, item_id: str, session: str, requested_at: float) -> Rank: ...

    def granted(self, item_id: str) -> None: ...

    def removed(self, item_id: str) -> None: ...

    def renamed(self, old_id: str, new_id: str) -> None: ...


class FifoOrdering:
    """Request time, then id: the order of requests."""

    def rank(self, key: str, item_id: str, session: str, requested_at: float) -> Rank:
        return (requested_at, item_id)

    def granted(self, item_id: str) -> None:
        pass

    def removed(self, item_id: str) -> None:
        pass

    def renamed(self, old_id: str, new_id: str) -> None:
        pass


class SessionOrdering:
    """Round-robin across sessions, FIFO within one (start-time fair queueing, unit weights)."""

    def __init__(self) -> None:
        self._round: dict[str, int] = {}  # key -> the tag of its last grant
        self._last: dict[str, dict[str, int]] = {}  # key -> session -> its last tag given
        self._items: dict[str, tuple[str, int]] = {}  # waiting item -> (key, tag)

    def rank(self, key: str, item_id: str, session: str, requested_at: float) -> Rank:
        current = self._round.get(key, 0)
        sessions = self._last.setdefault(key, {})
        last = sessions.get(session)
        tag = current if last is None else max(last + 1, current)
        sessions[session] = tag
        self._items[item_id] = (key, tag)
        return (tag, requested_at, item_id)

    def granted(self, item_id: str) -> None:
        entry = self._items.pop(item_id, None)
        if entry is None:
            return
        key, tag = entry
        current = max(self._round.get(key, 0), tag)
        self._round[key] = current
        # A session whose next tag would be the current round anyway needs no memory.
        sessions = self._last.get(key, {})
        for session in [s for s, last in sessions.items() if last + 1 <= current]:
            del sessions[session]

    def removed(self, item_id: str) -> None:
        self._items.pop(item_id, None)

    def renamed(self, old_id: str, new_id: str) -> None:
        """A turn took the place of the reservation it binds."""
        if old_id in self._items:
            self._items[new_id] = self._items.pop(old_id)


def make_ordering(fairness: str) -> Ordering:
    if fairness == "fifo":
        return FifoOrdering()
    if fairness == "session":
        return SessionOrdering()
    raise ValueError(f"fairness is one of {', '.join(FAIRNESS)}, not {fairness!r}")


def session_of(session: str | None, pid: int | None, item_id: str) -> str:
    """The session a waiter is counted in (see the module's note)."""
    if session is not None:
        return f"s:{session}"
    if pid is not None:
        return f"p:{pid}"
    return f"i:{item_id}"
