"""The one line a waiting `ccsup run` keeps current on a terminal:

    ccsup: turn 3f2a9c01: waiting for a slot of codex: position 2, key_full, since 10:00:01 (12s)

rewritten in place (carriage return, erase to the end of the line) when the position changes and
once a second for the time waited; why comes from `ps`, asked at most every WHY_EVERY seconds
(a waiter that waits long costs the supervisor one `ps` per WHY_EVERY, not one per second).
`finish` ends the line (a newline), before anything else is written to stderr. Not used off a
terminal: a script's stderr gets run's plain lines. A live line belongs to a job in the
terminal's foreground process group only (`in_foreground`): a `ccsup run ... &` in an interactive
shell gets run's plain lines too, each once, so it never rewrites the line the user types on.
Knows the terminal and the clock.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

WHY_EVERY = 2.0  # seconds between two `ps` asked for why


def in_foreground(stream=None) -> bool:
    """Whether we are in the foreground process group of the terminal `stream` (stderr) is on:
    false for a shell's background job (`&`, `bg`), which must not draw over the prompt."""
    stream = sys.stderr if stream is None else stream
    try:
        return os.tcgetpgrp(stream.fileno()) == os.getpgrp()
    except (OSError, ValueError):  # not a terminal, or closed
        return False


class WaitLine:
    def __init__(self, turn_id: str, key: str, ask_why: Callable[[], dict | None]):
        self.turn_id = turn_id
        self.key = key
        self.ask_why = ask_why
        self.shown = False
        self._asked_at = 0.0
        self._why: dict | None = None
        self._last = ""

    def show(self, position: object, since: float) -> None:
        """Redraw if due: `since` is when the wait started (time.monotonic())."""
        now = time.monotonic()
        if now - self._asked_at >= WHY_EVERY:
            self._asked_at = now
            self._why = self.ask_why()
        waited = now - since
        started = time.strftime("%H:%M:%S", time.localtime(time.time() - waited))
        why = (self._why or {}).get("reason")
        parts = [f"position {position}" if position is not None else None, why]
        parts.append(f"since {started} ({waited:.0f}s)")
        text = f"ccsup: turn {self.turn_id[:8]}: waiting for a slot of {self.key}: " + ", ".join(
            p for p in parts if p
        )
        if text == self._last:  # the seconds change once a second: at most a redraw a second
            return
        self._last, self.shown = text, True
        sys.stderr.write("\r\x1b[K" + text)
        sys.stderr.flush()

    def finish(self) -> None:
        if self.shown:
            sys.stderr.write("\n")
            sys.stderr.flush()
            self.shown = False
