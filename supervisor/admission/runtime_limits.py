"""Runtime limits: how long a turn of a key may run, and when it is warned. Pure: no I/O.

A turn's limit is the smaller of its own `timeout` (the turn argument, `ccsup run --timeout`) and
the key's `[slots] max_runtime` (the key named, else its bare harness, else none). Past it the
turn is stopped as a cancel stops it, with reason "timeout"; `[slots] expiring_notice` (default one
minute) before that, `turn.<id>.expiring` is published so a sidecar can wind its harness down.
A limit shorter than the notice is warned at once when the turn starts.

Knows durations; nothing of turns' states, timers or processes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from ..config.admission import DEFAULT_EXPIRING_NOTICE


@dataclass(frozen=True)
class Deadline:
    limit: float  # seconds the turn may run
    source: str  # "timeout" (the turn's own) or "max_runtime"
    stop_at: float  # epoch seconds
    warn_at: float  # epoch seconds, when `expiring` is published (<= stop_at)


class RuntimeLimits:
    def __init__(
        self,
        max_runtime: Mapping[str, float] | None = None,
        expiring_notice: float = DEFAULT_EXPIRING_NOTICE,
    ):
        self.max_runtime: Mapping[str, float] = MappingProxyType(dict(max_runtime or {}))
        self.expiring_notice = expiring_notice

    def max_for(self, key: str) -> float | None:
        if key in self.max_runtime:
            return self.max_runtime[key]
        harness, sep, _ = key.partition(":")
        return self.max_runtime.get(harness) if sep else None

    def deadline(self, key: str, timeout: float | None, started_at: float) -> Deadline | None:
        """The deadline of a turn of `key` asking `timeout`, started at `started_at`; None: none."""
        configured = self.max_for(key)
        if timeout is None and configured is None:
            return None
        if configured is None or (timeout is not None and timeout <= configured):
            limit, source = timeout, "timeout"
        else:
            limit, source = configured, "max_runtime"
        assert limit is not None
        stop_at = started_at + limit
        warn_at = max(started_at, stop_at - self.expiring_notice)
        return Deadline(limit, source, stop_at, warn_at)
