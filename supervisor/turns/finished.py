"""Finished ids: which turns and reservations ended, and how, remembered ten minutes.

A retried request with a finished id is answered with its terminal state, never run twice. The
ids live in memory, in the order they ended, and in `finished.log` (supervisor.turns.store: one line
appended per ending, compacted at start and when it has grown to twice what it should hold).
A turn's line also holds its end (`End`: its key, CMD's code, signal and reason, when CMD ended,
why it was stopped): written before its terminal event is published and before its slot is
granted again, so the history, whose writer batches, is repaired from it by the next supervisor
(supervisor.history.writer.Recorder.repair) when a SIGKILL took the end's events with it.

The state question: an append that fails (a full disk) is undone (no torn line) and reported to
the ledger, which keeps the item in queue.json's `running` list until `append_again` succeeds, so a
crash meanwhile ends it again rather than forgetting it (supervisor.turns.ledger); a crash
between an append and queue.json's save ends nothing twice (an id in
the log wins over the same id in queue.json's `running`); a torn last line is skipped and counted;
ids older than ten minutes are dropped at load and by `expire`. A line of an older build has no
end (its turn's history is not repaired); an end with fields it does not know is kept as it is,
and a line whose end is not a JSON object is skipped as torn. Knows ids, times, ends and the log;
nothing of turns' logic.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from guardd.record import RecordError

from ..filework import FileWorker
from ..paths import TURN_ID
from . import store

log = logging.getLogger("ccsup.finished")

FINISHED_MEMORY = 600.0  # seconds a finished id is remembered


class FinishedIds:
    def __init__(
        self, path: Path, clock: Callable[[], float], files: FileWorker | None = None
    ) -> None:
        self.path = path
        self.clock = clock
        self.files = files  # fsyncs each append soon, off the caller (else each is fsynced here)
        self._ids: dict[str, tuple[str, float]] = {}  # id -> (terminal state, epoch), oldest first
        self._ends: dict[
            str, dict[str, Any]
        ] = {}  # id -> its end (End), for the turns that have one
        self._appended = 0  # lines appended since the log was last compacted

    def __contains__(self, item_id: str) -> bool:
        return item_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def state_of(self, item_id: str) -> str | None:
        entry = self._ids.get(item_id)
        return entry[0] if entry else None

    def ends(self) -> dict[str, dict[str, Any]]:
        """Each remembered turn's end (End) with `state` and `ended_at` added: what the history
        must hold of it."""
        return {
            i: {**end, "state": self._ids[i][0], "ended_at": self._ids[i][1]}
            for i, end in self._ends.items()
            if i in self._ids
        }

    def remember(self, item_id: str, state: str, end: dict[str, Any] | None = None) -> bool:
        """In memory and appended to finished.log, before the terminal event is published.

        False when the append failed (a full disk): the id is remembered in memory only, and the
        caller keeps the item's end on file some other way until `append_again` succeeds."""
        at = self.clock()
        self._ids[item_id] = (state, at)
        if end is not None:
            self._ends[item_id] = end
        self._appended += 1
        return self.append_again(item_id)

    def append_again(self, item_id: str) -> bool:
        """Append the id's line (again): True once it is in finished.log."""
        state, at = self._ids.get(item_id, ("released", self.clock()))
        try:
            store.append_finished(
                self.path, item_id, state, at, self.files, end=self._ends.get(item_id)
            )
        except OSError as e:
            log.error("unable to append %s to %s: %s", item_id, self.path, e.strerror)
            return False
        return True

    def load(self, legacy: Mapping[str, object]) -> list[str]:
        """Take finished.log back (and `finished` of an older queue.json); returns problems."""
        problems: list[str] = []
        try:
            ends: dict[str, dict[str, Any]] = {}
            finished, skipped = store.load_finished(self.path, ends)
        except (RecordError, OSError) as e:  # a FIFO or symlink in its place, or far too long
            why = (
                str(e)
                if isinstance(e, RecordError)
                else f"unable to read {self.path}: {e.strerror}"
            )
            problems.append(store.move_aside(self.path, why))
            finished, skipped, ends = {}, 0, {}
        if skipped:
            problems.append(f"{self.path}: {skipped} unreadable lines skipped")
        for item_id, entry in legacy.items():
            if not isinstance(item_id, str) or not TURN_ID.match(item_id):
                # checked as a request's id is: one with a newline became two lines of the log
                problems.append(f"finished entry {str(item_id)[:200]!r} is not a turn id")
                continue
            try:
                finished.setdefault(item_id, (str(entry[0]), float(entry[1])))  # type: ignore[index]
            except (TypeError, ValueError, IndexError, KeyError):
                problems.append(f"finished entry {item_id!r} is malformed")
        now = self.clock()
        self._ids = {
            i: (state, at)
            for i, (state, at) in sorted(finished.items(), key=lambda kv: kv[1][1])
            if now - at < FINISHED_MEMORY
        }
        self._ends = {i: end for i, end in ends.items() if i in self._ids}
        self.compact()
        return problems

    def expire(self) -> None:
        """Forget ids older than ten minutes; compact the log when it has doubled."""
        now = self.clock()
        for item_id, (_, at) in list(self._ids.items()):
            if now - at <= FINISHED_MEMORY:
                break  # kept in the order they ended: the rest are younger
            del self._ids[item_id]
            self._ends.pop(item_id, None)
        if self._appended > 2 * len(self._ids) + 1000:
            self.compact()

    def compact(self) -> None:
        self._appended = 0
        try:
            store.rewrite_finished(self.path, self._ids, self._ends)
        except OSError as e:
            log.error("unable to rewrite %s: %s", self.path, e.strerror)
