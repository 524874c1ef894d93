"""`[pause_on.<key>]`: a turn's own stderr or exit code pauses its key.

A rule (`stderr = "(?i)rate.?limit|429"`, `exit_codes = [75]`, `for = "60s"`) applies to the turns
of the key named, or, named by a bare harness, to every key of that harness not named itself. A
turn whose stderr matches the pattern, or that exits with a listed code, pauses its own key for
`for`, or for N seconds when its stderr says `Retry-After: N` (before the match, or in the next
`RETRY_WINDOW` characters after it: the pause starts at the match and is then set to N). The
pause is capped by `[slots] max_pause` as every pause is. A turn pauses its key at most once.

Design note. Matching must not run on the supervisor's event loop, nor hold its GIL: a turn's
stderr has no size limit, and the pattern is the user's (one that backtracks can run for minutes,
and Python's `re` keeps the GIL for a whole search, so a thread alone would still freeze the loop).
The loop only appends each chunk to the turn's pending list (O(1)). One thread, shared by every
turn, hands the pending text (with a short tail of the previous text, so a match spanning two
chunks is found) to one matcher process
(`python -I -S`, stdlib only, fed over a pipe; not multiprocessing, whose `spawn` re-imports the
daemon's main module) and waits for its answer with the GIL released; a search that takes longer
than `SEARCH_TIMEOUT` kills the matcher (a new one starts on the next search) and counts as no
match, with a warning naming the pattern and the turn. Answers come back to the loop by `loop.call_soon_threadsafe`. A turn's pending text
is bounded (`PENDING_LIMIT`): when the matcher falls that far behind, the oldest pending chunks
are dropped and counted (a flood of output is not what a provider's 429 looks like; the latest
output is). Rejected: scanning in the loop with a byte budget (still grows with output, and a slow
pattern stalls every client), a thread per turn (hundreds of idle threads), and a thread alone
(the GIL, above).

Knows patterns, chunks, one thread and one matcher process; nothing of pauses' bookkeeping,
turns' states or sockets.
"""

from __future__ import annotations

import json
import logging
import re
import select
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ..config.admission import PauseRule

log = logging.getLogger("ccsup.pause_on")

PENDING_LIMIT = 1 << 20  # bytes of a turn's stderr waiting to be scanned, at most
TAIL = 1024  # characters of the previous chunk scanned again with the next one
RETRY_AFTER = re.compile(r"(?i)retry-after\s*[:=]?\s*(\d{1,7})")
RETRY_WINDOW = 64 * 1024  # characters after a match searched for its Retry-After
SEARCH_TIMEOUT = 5.0  # seconds one search may take in the matcher process


# The matcher process: stdlib only, started with `python -I -S -c` (about 10 ms). It reads
# requests `<length>\n<json {"p": pattern, "f": flags, "t": text}>` on stdin and answers each with
# one line `{"m": matched, "r": Retry-After seconds | null}`; it ends at the end of its input.
_MATCHER = r"""
import json, re, sys
RETRY = re.compile(RETRY_PATTERN)
inp, out = sys.stdin.buffer, sys.stdout
while True:
    size = inp.readline()
    if not size:
        break
    req = json.loads(inp.read(int(size)))
    text = req["t"]
    matched = re.compile(req["p"], req["f"]).search(text) is not None
    found = RETRY.findall(text) if matched else []
    out.write(json.dumps({"m": matched, "r": float(found[-1]) if found else None}) + "\n")
    out.flush()
""".replace("RETRY_PATTERN", repr(RETRY_AFTER.pattern))


class _Matcher:
    """The matcher process, started on first use and again after it was killed for a timeout."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None

    def search(self, pattern: re.Pattern[str], text: str) -> tuple[bool, float | None] | None:
        """(matched, Retry-After seconds), or None when the search failed or ran out of time."""
        try:
            proc = self._proc if self._proc is not None else self._start()
            assert proc.stdin is not None and proc.stdout is not None
            body = json.dumps({"p": pattern.pattern, "f": int(pattern.flags), "t": text}).encode()
            proc.stdin.write(b"%d\n%s" % (len(body), body))
            proc.stdin.flush()
            ready, _, _ = select.select([proc.stdout], [], [], SEARCH_TIMEOUT)
            if ready:
                answer = json.loads(proc.stdout.readline())
                return bool(answer["m"]), answer["r"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("the pause_on matcher process failed (%s); starting another", e)
        self.close()
        return None

    def _start(self) -> subprocess.Popen[bytes]:
        self._proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _MATCHER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
        )
        return self._proc

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.kill()
            proc.wait()
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()


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
    matched: bool = False  # the pattern matched: only a Retry-After is looked for now
    after_match: int = 0  # characters searched for a Retry-After since the match
    done: bool = False  # nothing more is scanned
    closing: bool = False  # the turn ended: scan what is pending, then call on_done
    scanning: bool = False  # the worker holds a batch of this turn's text


class StderrScanner:
    """One worker thread matching turns' stderr, reporting on the loop (through `call_soon`):
    `on_match(turn_id, context, retry_after_seconds | None, refine)` once at the match, and once
    more with refine=True if a Retry-After comes after it; `on_done(turn_id, context)` once the
    turn ended (`finish`) and all it wrote was scanned."""

    def __init__(
        self,
        on_match: Callable[[str, object, float | None, bool], None],
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
        self._matcher = _Matcher()

    def watch(self, turn_id: str, pattern: re.Pattern[str], context: object = None) -> None:
        with self._cond:
            if turn_id in self._watches:  # watched from its grant, then said started
                return
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
        """The turn ended: scan what it wrote, then `on_done`. False when there is nothing left to
        scan (not watched, matched already, or all it wrote was scanned): no `on_done` then."""
        with self._cond:
            watch = self._watches.get(turn_id)
            if watch is None:
                return False
            if watch.done or not (watch.pending or watch.scanning):
                self._drop(turn_id)
                return False
            watch.closing = True
            self._ready.append(turn_id)
            self._cond.notify()
        return True

    def forget(self, turn_id: str) -> None:
        """The turn is over: stop watching it, unless its end is being scanned (`finish`)."""
        with self._cond:
            watch = self._watches.get(turn_id)
            if watch is not None and not watch.closing:
                self._drop(turn_id)

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
        self._matcher.close()

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
                watch.scanning = True
                tail = watch.tail
            text = tail + b"".join(chunks).decode("utf-8", errors="replace")
            refine = watch.matched
            try:
                answer = self._matcher.search(RETRY_AFTER if refine else watch.pattern, text)
            except Exception:  # noqa: BLE001 - a bug here must not leave a key waiting forever
                log.exception("turn %s: the pause_on search failed; no match", turn_id)
                answer = None
            if answer is None and not refine:
                log.warning(
                    "turn %s: the pause_on pattern %r took over %gs on its stderr; no match",
                    turn_id,
                    watch.pattern.pattern[:200],
                    SEARCH_TIMEOUT,
                )
            matched, seconds = answer or (False, None)
            with self._cond:
                watch.scanning = False
                watch.tail = text[-TAIL:]
                if watch.closing:
                    self._ready.append(turn_id)  # come back to report it done
                if refine:
                    watch.after_match += len(text) - len(tail)
                    watch.done = matched or watch.after_match > RETRY_WINDOW
                    if not matched:
                        continue
                elif not matched:
                    continue
                else:
                    watch.matched = True
                    watch.done = seconds is not None
                    watch.tail = ""  # a Retry-After is looked for after the match only
                if watch.done:
                    watch.pending.clear()
                self._call_soon(self._on_match, turn_id, watch.context, seconds, refine)
