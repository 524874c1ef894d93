"""Start-rate limits: at most N grants of a key in any window of W seconds. Pure: no I/O, no clock.

Design note. A sliding-window log, not a token bucket: the key keeps the times of its last N
grants, and a new grant is allowed at `now` only when the oldest of them is at least W old
(`now >= times[-N] + W`). Then no half-open window of length W ever holds more than N grants,
which is the promise (`[slots] rates = { codex = "20/min" }`: never more than 20 in any minute).
A token bucket of N tokens refilled at N/W lets 2N through in a window that starts just before a
full bucket is drained (N at once, then N refilled over the window), so it was rejected. The log
costs N floats per key, and the answer "from when" is exact: `times[-N] + W`.

Which rate a key has, first match wins: the key named in `rates`; for `harness:variant`, the bare
harness named in `rates` (each such key on its own, not shared, as with caps); else no limit.

State: `to_json()` / `from_json()` keep the grant times of the current window across a restart
(the grants of the current window still count); older times, times from the future (a clock that
went back) and entries that cannot be read are dropped, the last two reported.

Knows rates and times; nothing of queues, slots or files.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from types import MappingProxyType

from ..config.admission import Rate


class RateTable:
    """Which Rate applies to a key (key, else its bare harness, else none)."""

    def __init__(self, rates: Mapping[str, Rate] | None = None):
        self.rates: Mapping[str, Rate] = MappingProxyType(dict(rates or {}))

    def rate_for(self, key: str) -> Rate | None:
        if key in self.rates:
            return self.rates[key]
        harness, sep, _ = key.partition(":")
        return self.rates.get(harness) if sep else None


class StartWindows:
    """The grant times of each rate-limited key, enough to decide the next grant."""

    def __init__(self, table: RateTable):
        self.table = table
        self._times: dict[str, deque[float]] = {}

    def next_allowed(self, key: str, now: float) -> float | None:
        """When the key's next grant is allowed: None when now, else the epoch time."""
        rate = self.table.rate_for(key)
        times = self._times.get(key)
        if rate is None or times is None or len(times) < rate.count:
            return None
        opens = times[-rate.count] + rate.window
        return opens if opens > now else None

    def record(self, key: str, at: float) -> None:
        """A grant of `key` happened at `at` (call only when next_allowed said it may)."""
        rate = self.table.rate_for(key)
        if rate is None:
            return
        times = self._times.get(key)
        if times is None or times.maxlen != rate.count:
            times = deque(times or (), maxlen=rate.count)
            self._times[key] = times
        times.append(at)

    def restamp(self, key: str, granted_at: float, started_at: float) -> None:
        """A grant counted at `granted_at` is counted from `started_at` instead (its work started
        then): the window is judged on when work starts, which is what a provider sees."""
        times = self._times.get(key)
        if times is None or granted_at not in times or started_at <= granted_at:
            return
        moved = list(times)
        moved[moved.index(granted_at)] = started_at
        self._times[key] = deque(sorted(moved), maxlen=times.maxlen)

    def retune(self, table: RateTable) -> None:
        """New rates (a reload): keys keep their recent grant times, trimmed to the new counts."""
        self.table = table
        for key in list(self._times):
            rate = table.rate_for(key)
            if rate is None:
                del self._times[key]
            else:
                self._times[key] = deque(self._times[key], maxlen=rate.count)

    def forget_old(self, now: float) -> None:
        """Drop keys whose last grant is older than their window: they no longer limit anything."""
        for key, times in list(self._times.items()):
            rate = self.table.rate_for(key)
            if rate is None or not times or times[-1] + rate.window <= now:
                del self._times[key]

    # -- across restarts ---------------------------------------------------------------------

    def to_json(self) -> dict[str, list[float]]:
        return {key: list(times) for key, times in self._times.items() if times}

    def from_json(self, data: object, now: float) -> list[str]:
        if not isinstance(data, dict):
            return [f"start windows: expected an object, not {type(data).__name__}"]
        problems = []
        for key, times in data.items():
            rate = self.table.rate_for(str(key))
            if rate is None:
                continue  # no longer limited
            if not isinstance(times, list) or not all(
                isinstance(t, (int, float)) and not isinstance(t, bool) for t in times
            ):
                problems.append(f"start window of {key!r} is malformed")
                continue
            if any(t > now + 1.0 for t in times):
                problems.append(f"start window of {key!r} has times in the future; dropped")
                continue
            recent = sorted(float(t) for t in times if float(t) + rate.window > now)
            if recent:
                self._times[str(key)] = deque(recent, maxlen=rate.count)
        return problems
