"""`[pause_on.<key>]`: a turn's own stderr or exit code pauses its key.

A rule (`stderr = "(?i)rate.?limit|429"`, `exit_codes = [75]`, `for = "60s"`) applies to the turns
of the key named, or, named by a bare harness, to every key of that harness not named itself. A
turn whose stderr matches the pattern, or that exits with a listed code, pauses its own key for
`for`, or for N seconds when the stderr around the match says `Retry-After: N`. (The pause is then
capped by `[slots] max_pause` as every pause is.) A turn pauses its key at most once.

Design note. Matching must not run on the supervisor's event loop: a turn's stderr has no size
limit, and the pattern is the user's (a bad one can backtrack for a long time). The loop only
appends each chunk to the turn's pending list (O(1)); one worker thread, shared by every turn,
scans the pending text (a short tail of the previous chunk is kept, so a match that spans two
chunks is found) and hands a match back with `loop.call_soon_threadsafe`. A turn's pending text is
bounded (`PENDING_LIMIT`): when the scanner falls that far behind, the oldest pending chunks are
dropped and counted (a flood of output is not what a provider's 429 looks like; the latest output
is). Rejected: scanning in the loop with a byte budget (still grows with output, and a slow pattern
stalls every client), and a thread per turn (hundreds of idle threads).

Knows patterns, chunks and one thread; nothing of pauses' bookkeeping, turns' states or sockets.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

log = logging.getLogger("ccsup.pause_on")

PENDING_LIMIT = 1 << 20  # bytes of a turn's stderr waiting to be scanned, at most
TAIL = 1024  # characters of the previous chunk scanned again with the next one
RETRY_AFTER = re.compile(r"(?i)retry-after\s*[:=]?\s*(\d{1,7})")


@dataclass(frozen=True)
class PauseRule:
    key: str  # the key or bare harness of the section
    stderr: re.Pattern[str] | None = None
    exit_codes: frozenset[int] = frozenset()
    for_: float = 60.0


class PauseRules:
    def __init__(self, rules: Mapping[str, PauseRule] | None = None):
        self.rules: Mapping[str, PauseRule] = MappingProxyType(dict(rules or {}))

    def rule_for(self, key: str) -> PauseRule | None:
        if key in self.rules:
            return self.rules[key]
        harness, sep, _ = key.partition(":")
        return self.rules.get(harness) if sep else None


def retry_after(text: str) -> float | None:
    """N from the last `Retry-After: N` in `text`, else None."""
    found = RETRY_AFTER.findall(text)
    return float(found[-1]) if found else None


@dataclass
class _Watch:
    pattern: re.Pattern[str]
    context: object  # handed back with the match, as the caller gave it
    pending: deque[bytes] = field(default_factory=deque)
    pending_bytes: int = 0
    dropped: int = 0
    tail: str = ""
    done: bool = False  # matched: nothing more is scanned
    closing: bool = False  # the turn ended: scan what is pending, then call on_done


class StderrScanner:
    """One worker thread matching turns' stderr, reporting on the loop (through `call_soon`):
    `on_match(turn_id, context, retry_after_seconds | None)` once per turn at most, and
    `on_done(turn_id, context)` once the turn ended (`finish`) and all it wrote was scanned."""

    def __init__(
        self,
        on_match: Callable[[str, object, float | None], None],
        on_done: Callable[[str, object], None],
        call_soon: Callable,
    ) -> None:
        self._on_match = on_match
        self._on_done = on_done
        self._call_soon = call_soon  # loop.call_soon_threadsafe
        self._watches: dict[str, _Watch] = {}
        self._ready: deque[str] = deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def watch(self, turn_id: str, pattern: re.Pattern[str], context: object = None) -> None:
        with self._cond:
            self._watches[turn_id] = _Watch(pattern, context)
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(
                    target=self._run, name="ccsup-pause-on", daemon=True
                )
                self._thread.start()

    def feed(self, turn_id: str, data: bytes) -> None:
        """A chunk of the turn's stderr (called on the loop: constant work)."""
        with self._cond:
            watch = self._watches.get(turn_id)
            if watch is None or watch.done:
                return
            watch.pending.append(data)
            watch.pending_bytes += len(data)
            while watch.pending_bytes > PENDING_LIMIT and len(watch.pending) > 1:
                old = watch.pending.popleft()
                watch.pending_bytes -= len(old)
                watch.dropped += len(old)
                watch.tail = ""  # what came before is no longer contiguous
            self._ready.append(turn_id)
            self._cond.notify()

    def finish(self, turn_id: str) -> bool:
        """The turn ended: scan what it wrote, then `on_done`. False when it was not watched."""
        with self._cond:
            watch = self._watches.get(turn_id)
            if watch is None:
                return False
            watch.closing = True
            self._ready.append(turn_id)
            self._cond.notify()
        return True

    def _drop(self, turn_id: str) -> None:
        watch = self._watches.pop(turn_id, None)
        if watch is not None and watch.dropped:
            log.warning(
                "turn %s: %d bytes of stderr were not scanned for its pause_on pattern "
                "(the scanner fell behind)",
                turn_id,
                watch.dropped,
            )

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._ready and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                turn_id = self._ready.popleft()
                watch = self._watches.get(turn_id)
                if watch is None:
                    continue
                if watch.done or not watch.pending:
                    if watch.closing:
                        self._drop(turn_id)
                        self._call_soon(self._on_done, turn_id, watch.context)
                    continue
                chunks, watch.pending = watch.pending, deque()
                watch.pending_bytes = 0
                tail = watch.tail
            text = tail + b"".join(chunks).decode("utf-8", errors="replace")
            match = watch.pattern.search(text)
            with self._cond:
                watch.tail = text[-TAIL:]
                if watch.closing:
                    self._ready.append(turn_id)  # come back to report it done
                if match is None or watch.done:
                    continue
                watch.done = True
                watch.pending.clear()
                self._call_soon(self._on_match, turn_id, watch.context, retry_after(text))
