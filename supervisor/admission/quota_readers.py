"""The quota readers: while a turn of a harness's key runs, what the harness itself says about its
provider windows is read and told to the key's windows (supervisor.admission.quota).

Design note. Everything that grows with a turn's output runs in one thread of its own, never on
the event loop: the loop only hands over what it already has (each output chunk of a turn being
read, its start and its end, one queue put each) and takes back a reading now and then
(`call_soon_threadsafe`). The thread splits the output into lines (a line longer than MAX_LINE is
dropped and counted), runs the harness's parsers (supervisor.admission.quota_signals) on the few
lines that can be signals (each parser looks for a fixed word before parsing), and polls the
Codex session files of the turn's CODEX_HOME every POLL seconds while a Codex turn runs, and once
more after it ended (Codex writes the 429's record just before it exits). A limit message in the
text (to the minute) is told at the turn's end, and only when no number said a window of the
turn is full (the number has the reset to the second). Rejected: inotify
(Linux-only in the standard library through ctypes, and the files are few), and reading the
turn's log files (the chunks are already in memory once).

Which turns: a key's harness is its part before ":" (`codex:work` is Codex), read when it is in
`[quota] read`. The Codex session directory is the turn's `CODEX_HOME` (its environment, else
the supervisor's), else `$HOME/.codex` of the same; only the files written after the turn started
are read, from where they stood when the watch began. Several turns on one CODEX_HOME share one
watch; a reading there is told to each of their keys.

A payload that is one of the signals but cannot be read (a session file cut short, a status line
not JSON) is skipped and counted (`failed`), never fatal; a reading the book refuses (a reset in
the past: an old line) is counted the same way.

State: none kept; a restarted supervisor reads the turns it adopts from their next output on.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .quota_signals import (
    Reading,
    SignalError,
    claude_stream_line,
    codex_session_line,
    limit_text,
    opencode_line,
)

log = logging.getLogger("ccsup.quota")

POLL = 0.25  # seconds between two looks at a running Codex turn's session files
MAX_LINE = 4 << 20  # a longer line is dropped (counted): no signal is anywhere near this long
HARNESSES = ("codex", "claude", "opencode")
FULL = 0.999  # a window this used is at its limit
# Every signal line holds one of these (quota_signals' parsers look for them first): a chunk
# without any, with nothing of one in the unfinished line before it, is passed over whole.
MARKERS = (b"rate_limit", b"hit your", b"responseHeaders")


def _marked(buffer: bytearray, data: bytes) -> bool:
    edge = bytes(buffer[-16:]) + data[:16]
    return any(m in data or m in buffer or m in edge for m in MARKERS)


Take = Callable[[str, Reading], None]  # (key, reading), called on the event loop


@dataclass
class _Turn:
    key: str
    harness: str
    home: Path | None  # the Codex session root watched for it
    buffers: dict[str, bytearray] = field(default_factory=dict)
    dropping: set[str] = field(default_factory=set)  # streams inside an over-long line
    text: list[Reading] = field(default_factory=list)  # limit messages, told at the end
    full: bool = False  # a number said a window is full (then the text, to the minute, is not told)


@dataclass
class _Home:
    root: Path  # <CODEX_HOME>/sessions
    since: float
    turns: set[str] = field(default_factory=set)
    offsets: dict[Path, int] = field(default_factory=dict)
    partial: dict[Path, bytes] = field(default_factory=dict)


def codex_home(env: Mapping[str, str | None], replace: bool, cwd: str | None) -> Path:
    """The CODEX_HOME a turn's Codex uses: its environment's, else the supervisor's, else
    $HOME/.codex (a relative one is the turn's cwd's)."""
    mine: Mapping[str, str | None] = {} if replace else os.environ
    home = env.get("CODEX_HOME") or (None if "CODEX_HOME" in env else mine.get("CODEX_HOME"))
    if not home:
        base = env.get("HOME") or mine.get("HOME") or os.path.expanduser("~")
        home = os.path.join(base, ".codex")
    return Path(cwd or os.getcwd(), home)


class QuotaReaders:
    def __init__(
        self,
        read: frozenset[str],
        take: Take,
        failed: Callable[[str], None],
        call_soon_threadsafe: Callable[..., object],
        clock: Callable[[], float] = time.time,
    ):
        self.read = read
        self._take = take
        self._failed = failed
        self._post = call_soon_threadsafe
        self.clock = clock
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._reading: set[str] = set()  # turn ids being read (the loop's view)
        # The thread's own:
        self._turns: dict[str, _Turn] = {}
        self._homes: dict[Path, _Home] = {}

    # -- on the event loop -------------------------------------------------------------------

    def turn_started(self, turn_id: str, key: str, codex_home: Path) -> None:
        """`codex_home`: the turn's (see `codex_home()`), taken while its environment was known."""
        harness = key.partition(":")[0]
        if harness not in HARNESSES or harness not in self.read:
            return
        home = codex_home / "sessions" if harness == "codex" else None
        self._reading.add(turn_id)
        self._send(("start", turn_id, key, harness, home, self.clock()))

    def reading(self, turn_id: str) -> bool:
        return turn_id in self._reading

    def output(self, turn_id: str, stream: str, data: bytes) -> None:
        if turn_id in self._reading:
            self._send(("data", turn_id, stream, data))

    def turn_ended(self, turn_id: str, done: Callable[[], None] | None = None) -> None:
        """The turn ended: its last lines and records are read, then `done` is called on the
        loop (after every reading of it was handed over)."""
        if turn_id in self._reading:
            self._reading.discard(turn_id)
            self._send(("end", turn_id, done))

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(5)
            self._thread = None

    def _send(self, message: tuple) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="quota-readers", daemon=True)
            self._thread.start()
        self._queue.put(message)

    # -- in the thread -----------------------------------------------------------------------

    def _run(self) -> None:
        next_poll = 0.0
        while True:
            wait = max(next_poll - time.monotonic(), 0.0) if self._homes else None
            try:
                message = self._queue.get(timeout=wait)
            except queue.Empty:
                message = ()
            if message is None:
                return
            try:
                if message:
                    self._handle(message)
                if self._homes and time.monotonic() >= next_poll:
                    for home in list(self._homes.values()):
                        self._poll(home)
                    next_poll = time.monotonic() + POLL
            except Exception:  # noqa: BLE001 -- a reader's bug must not end the reading
                log.exception("quota reader failed on %s", str(message)[:80])

    def _handle(self, message: tuple) -> None:
        kind = message[0]
        if kind == "start":
            _, turn_id, key, harness, home, started = message
            self._turns[turn_id] = _Turn(key, harness, home)
            if home is not None:
                watch = self._homes.get(home)
                if watch is None:
                    watch = self._homes[home] = _Home(home, started)
                    self._skip_old(watch)
                watch.turns.add(turn_id)
        elif kind == "data":
            _, turn_id, stream, data = message
            turn = self._turns.get(turn_id)
            if turn is not None:
                self._feed(turn, stream, data)
        elif kind == "end":
            try:
                self._end(message[1])
            finally:
                if message[2] is not None:
                    self._post(message[2])

    def _end(self, turn_id: str) -> None:
        turn = self._turns.get(turn_id)
        if turn is not None:
            for stream, buffer in turn.buffers.items():
                if buffer and stream not in turn.dropping:
                    self._line(turn, stream, bytes(buffer))
            watch = self._homes.get(turn.home) if turn.home is not None else None
            if watch is not None:
                self._poll(watch, also=turn.key)  # its last records, written as it exited
                watch.turns.discard(turn_id)
                if not watch.turns:
                    del self._homes[watch.root]
            del self._turns[turn_id]
            if not turn.full:  # the limit message's time is only to the minute: numbers first
                for reading in turn.text:
                    self._post(self._take, turn.key, reading)

    def _feed(self, turn: _Turn, stream: str, data: bytes) -> None:
        buffer = turn.buffers.setdefault(stream, bytearray())
        if stream not in turn.dropping and not _marked(buffer, data):
            # No line ending here can be a signal: only the last, unfinished one is kept.
            end = data.rfind(b"\n")
            if end >= 0:
                buffer[:] = data[end + 1 :]
            else:
                buffer += data
            if len(buffer) > MAX_LINE:
                buffer.clear()
                turn.dropping.add(stream)
                self._failed(f"a line of over {MAX_LINE} bytes in a {turn.harness} turn")
            return
        start = 0
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                if stream not in turn.dropping:
                    buffer += data[start:]
                    if len(buffer) > MAX_LINE:
                        buffer.clear()
                        turn.dropping.add(stream)
                        self._failed(f"a line of over {MAX_LINE} bytes in a {turn.harness} turn")
                return
            if stream in turn.dropping:
                turn.dropping.discard(stream)
            else:
                buffer += data[start:end]
                self._line(turn, stream, bytes(buffer))
            buffer.clear()
            start = end + 1

    def _line(self, turn: _Turn, stream: str, line: bytes) -> None:
        now = self.clock()
        try:
            readings: list[Reading] = []
            if turn.harness == "claude" and stream == "stdout":
                readings = claude_stream_line(line)
            elif turn.harness == "opencode" and stream == "stdout":
                readings = opencode_line(line, now)
            json_line = line.lstrip().startswith(b"{")
            if (
                not readings
                and b"hit your" in line
                and not (turn.harness == "claude" and json_line)
            ):
                turn.text += [
                    Reading(r.window, r.used, r.resets_at, stream)
                    for r in limit_text(line.decode(errors="replace"), now)
                ]
        except SignalError as e:
            self._failed(f"{turn.harness} {stream}: {e}")
            return
        for reading in readings:
            turn.full |= reading.used >= FULL
            self._post(self._take, turn.key, reading)

    # -- Codex session files -----------------------------------------------------------------

    def _day_dirs(self, root: Path) -> list[Path]:
        now = self.clock()
        days = set()
        for offset in (-86400, 0, 86400):
            for when in (
                dt.datetime.fromtimestamp(now + offset),
                dt.datetime.fromtimestamp(now + offset, dt.UTC),
            ):
                days.add(root / f"{when:%Y}" / f"{when:%m}" / f"{when:%d}")
        return sorted(days)

    def _files(self, watch: _Home) -> list[Path]:
        found = []
        for day in self._day_dirs(watch.root):
            try:
                names = os.listdir(day)
            except OSError:
                continue
            found += [day / n for n in names if n.startswith("rollout-") and n.endswith(".jsonl")]
        return found

    def _skip_old(self, watch: _Home) -> None:
        """Files written before the watch began are read from where they stand."""
        for path in self._files(watch):
            try:
                stat = path.stat()
            except OSError:
                continue
            if stat.st_mtime < watch.since - 1.0:
                watch.offsets[path] = stat.st_size

    def _poll(self, watch: _Home, also: str | None = None) -> None:
        keys = {self._turns[t].key for t in watch.turns if t in self._turns}
        if also is not None:
            keys.add(also)
        for path in self._files(watch):
            offset = watch.offsets.get(path, 0)
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    data = f.read()
            except OSError:
                continue
            if not data:
                continue
            watch.offsets[path] = offset + len(data)
            text = watch.partial.pop(path, b"") + data
            lines = text.split(b"\n")
            if lines[-1]:
                watch.partial[path] = lines[-1]
            for line in lines[:-1]:
                try:
                    readings = codex_session_line(line)
                except SignalError as e:
                    self._failed(f"codex session file {path.name}: {e}")
                    continue
                for reading in readings:
                    for key in sorted(keys):
                        self._post(self._take, key, reading)
                    if reading.used >= FULL:
                        for turn_id in watch.turns:
                            if turn_id in self._turns:
                                self._turns[turn_id].full = True
