"""Paused keys: which cap key may not be granted until when, and why. Pure: no I/O, no clock.

A pause is set on a key (`opencode:xai`) or on a bare harness name (`opencode`), which pauses
every key of that harness (`opencode:*`) as well as the bare key itself. A key is paused until the
latest `until` of the pauses that cover it: its own, and its harness's.

Several pauses of one key merge into one that ends at the latest `until`, and no pause ends later
than `now + max_pause` (default one hour): a sidecar gone wrong cannot freeze a key for good. A
later, shorter pause never shortens a longer one; only `resume` ends a pause early.

A bus request is idempotent by its id: the book remembers the answer given to each request id
(for `ID_MEMORY` seconds) and gives the same answer again without changing anything.

The caller passes the time (`now`, epoch seconds) to every call, so a test needs no clock; it asks
`next_expiry()` when to call `expire(now)`, which removes and returns the pauses that ended, for
the caller to announce `key.<key>.resumed {reason: "expired"}`.

State: `to_json()` / `from_json()` carry the pauses and remembered ids across a supervisor
restart; a pause that ended while the supervisor was down is not restored (`from_json` drops it,
and `expire` would anyway), and a restored pause is capped again at `now + max_pause`. Entries
that cannot be read are skipped and reported, never guessed.

Knows keys, times and reasons; nothing of queues, slots, files or sockets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from ..config.admission import DEFAULT_MAX_PAUSE

ID_MEMORY = 600.0  # seconds a pause request's id is remembered (as finished turn ids are)


class PauseJSON(TypedDict):
    key: str
    until: float
    reason: str | None
    by: str | None
    since: float


@dataclass(frozen=True)
class Pause:
    key: str  # the key or bare harness name that was paused
    until: float  # epoch seconds
    reason: str | None
    by: str | None  # who paused it: "cli", "bus", "pause_on:<turn>", a client's label
    since: float

    def to_json(self) -> PauseJSON:
        return {
            "key": self.key,
            "until": self.until,
            "reason": self.reason,
            "by": self.by,
            "since": self.since,
        }


@dataclass(frozen=True)
class PauseAnswer:
    """What a pause request changed: the key's pause after it, and whether it changed anything."""

    pause: Pause
    changed: bool  # False for a repeat of a known id, or a pause already ending later
    capped: bool  # the asked `until` was beyond now + max_pause
    repeat: bool = False  # a request id already answered


def harness_of(key: str) -> str:
    return key.partition(":")[0]


class PauseBook:
    def __init__(self, max_pause: float = DEFAULT_MAX_PAUSE):
        if max_pause <= 0:
            raise ValueError("max_pause must be more than zero")
        self.max_pause = max_pause
        self._pauses: dict[str, Pause] = {}
        self._answers: dict[str, tuple[float, Pause]] = {}  # request id -> (answered at, pause)

    def pause(
        self,
        key: str,
        until: float,
        now: float,
        *,
        reason: str | None = None,
        by: str | None = None,
        request_id: str | None = None,
        refine: bool = False,
    ) -> PauseAnswer:
        """Pause `key` until `until` (merged with a pause it has; capped at now + max_pause).

        `refine`: the one who set the key's current pause (same `by`) sets its end anew, sooner
        too (a Retry-After that came after the line that paused the key)."""
        if request_id is not None and request_id in self._answers:
            return PauseAnswer(
                self._answers[request_id][1], changed=False, capped=False, repeat=True
            )
        limit = now + self.max_pause
        capped = until > limit
        until = min(until, limit)
        current = self._pauses.get(key)
        if refine and current is not None and current.by == by and current.until > now:
            if until <= now:
                return PauseAnswer(current, changed=False, capped=capped)
            pause = Pause(key, until, reason, by, current.since)
            self._pauses[key] = pause
            return PauseAnswer(pause, changed=pause != current, capped=capped)
        if current is not None and current.until > now and current.until >= until:
            answer = PauseAnswer(current, changed=False, capped=capped)
        elif until <= now:
            # A pause that is already over changes nothing (a late retry of an old request).
            answer = PauseAnswer(Pause(key, until, reason, by, now), changed=False, capped=capped)
        else:
            since = current.since if current is not None and current.until > now else now
            pause = Pause(key, until, reason, by, since)
            self._pauses[key] = pause
            answer = PauseAnswer(pause, changed=True, capped=capped)
        if request_id is not None:
            self._answers[request_id] = (now, answer.pause)
        return answer

    def resume(self, key: str) -> list[Pause]:
        """End the pause of `key` now; for a bare harness name, also every pause of its keys.

        Returns the pauses ended (empty when nothing was paused). A key stays paused when its
        harness is paused: `covering()` says by what.
        """
        ended = []
        for paused_key in list(self._pauses):
            if paused_key == key or (":" not in key and harness_of(paused_key) == key):
                ended.append(self._pauses.pop(paused_key))
        return ended

    def covering(self, key: str, now: float) -> Pause | None:
        """The pause that holds `key` longest at `now` (its own or its harness's), or None."""
        candidates = [self._pauses.get(key)]
        harness = harness_of(key)
        if harness != key:
            candidates.append(self._pauses.get(harness))
        live = [p for p in candidates if p is not None and p.until > now]
        return max(live, key=lambda p: p.until) if live else None

    def paused_until(self, key: str, now: float) -> float | None:
        pause = self.covering(key, now)
        return pause.until if pause else None

    def active(self, now: float) -> list[Pause]:
        """Every pause still running at `now`, by key."""
        return sorted((p for p in self._pauses.values() if p.until > now), key=lambda p: p.key)

    def next_expiry(self) -> float | None:
        return min((p.until for p in self._pauses.values()), default=None)

    def expire(self, now: float) -> list[Pause]:
        """Remove and return the pauses that ended by `now`; forget old request ids."""
        ended = [p for p in self._pauses.values() if p.until <= now]
        for pause in ended:
            del self._pauses[pause.key]
        for request_id, (at, _) in list(self._answers.items()):
            if now - at > ID_MEMORY:
                del self._answers[request_id]
        return sorted(ended, key=lambda p: p.key)

    # -- across restarts ---------------------------------------------------------------------

    def to_json(self) -> dict:
        return {
            "pauses": [p.to_json() for p in self._pauses.values()],
            "ids": {i: [at, p.to_json()] for i, (at, p) in self._answers.items()},
        }

    def from_json(self, data: object, now: float) -> list[str]:
        """Restore what `to_json` wrote; returns the problems found (entries skipped)."""
        problems: list[str] = []
        if not isinstance(data, dict):
            return [f"pauses: expected an object, not {type(data).__name__}"]
        for entry in data.get("pauses") or []:
            pause = _pause_from_json(entry)
            if pause is None:
                problems.append(f"pause entry {str(entry)[:200]} is malformed")
            elif pause.until > now:  # one that ended while the supervisor was down stays ended
                until = min(pause.until, now + self.max_pause)
                self._pauses[pause.key] = Pause(
                    pause.key, until, pause.reason, pause.by, pause.since
                )
        ids = data.get("ids") or {}
        if isinstance(ids, dict):
            for request_id, value in ids.items():
                try:
                    at, raw = float(value[0]), value[1]
                except (TypeError, ValueError, IndexError, KeyError):
                    problems.append(f"pause request id {request_id!r} is malformed")
                    continue
                pause = _pause_from_json(raw)
                if pause is not None and now - at <= ID_MEMORY:
                    self._answers[str(request_id)] = (at, pause)
        return problems


def _pause_from_json(entry: object) -> Pause | None:
    if not isinstance(entry, dict):
        return None
    key, until, since = entry.get("key"), entry.get("until"), entry.get("since")
    reason, by = entry.get("reason"), entry.get("by")
    if not isinstance(key, str) or not _number(until) or not _number(since):
        return None
    if not (reason is None or isinstance(reason, str)) or not (by is None or isinstance(by, str)):
        return None
    return Pause(key, float(until), reason, by, float(since))  # type: ignore[arg-type]


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
