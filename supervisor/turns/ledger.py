"""The ledger: every unfinished turn and reservation, the wait queue, and the order events leave in.

Design note. Everything that happens to an item ends in `Ledger.apply`, which advances it through
the transition table (supervisor.turns.states), and, when the event changes what queue.json must hold,
saves the file *before* the event is published: a crash can lose an announcement, never make a
restarted supervisor run or announce something twice. `batch()` groups several changes into one
save followed by their events in order. `apply(..., replay=True)` advances without publishing:
restore uses it to bring a saved item to the state its events already told the world.

`_finish` is the one place an item reaches its terminal event (released, cancelled, rejected):
it is dropped from every index, unwatched, and its id remembered as finished; then `on_finished`
hooks run (history and metrics belong there).

A full disk: nothing is acknowledged that is not on file. A new request's entry is
written first (`save_first`), before anything of it changes or is published; when it cannot be,
the manager refuses the request (`no_space`, naming the file) and nothing of it exists. A later
save that fails keeps what changed in memory and says so once (`save_error`); the periodic
`save_again` tries again, and no guard starts while its grant is not on file (the manager holds
it, granted, until then). An end that finished.log cannot take (`FinishedIds.remember` is False)
keeps the item in queue.json's `running` list (`unsaved_ends`) until the append succeeds, so a
crash meanwhile ends its story again instead of forgetting it (a retried request with its id
would run it a second time). Known limit: a waiting turn cancelled while neither queue.journal
nor finished.log can take a line is still `waiting` on file, so a crash before either can be
written brings it back.

Knows items, the queue, timers and queue.json; nothing of slots' locks, guards or sockets (it
publishes through a callable and schedules through `Timers`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..filework import FileWorker
from . import store
from .fairness import Ordering, session_of
from .finished import FinishedIds
from .seams import Timer, Timers
from .states import Event, Item, Reservation, State, Turn
from .waits import WaitQueue

log = logging.getLogger("ccsup.ledger")

# Events after which queue.json must change: the file is saved before they are published.
PERSISTED = frozenset(
    {Event.QUEUED, Event.GRANTED, Event.CANCELLED, Event.RELEASED, Event.REJECTED}
)

Publish = Callable[[str, dict[str, Any]], None]


class Ledger:
    def __init__(
        self,
        *,
        queue_path: Path,
        publish: Publish,
        finished: FinishedIds,
        timers: Timers,
        clock: Callable[[], float],
        ordering: Ordering | None = None,
        files: FileWorker | None = None,
    ):
        self.queue_path = queue_path
        self.queue_file = store.QueueFile(queue_path, files)  # queue.json + its journal
        self.files = self.queue_file.files  # fsyncs and removals off the event loop
        self.publish = publish
        self.finished = finished
        self.timers = timers
        self.clock = clock
        # Ordered by `ordering` ([slots] fairness; default FIFO), sessions named from the items.
        self.queue = WaitQueue(ordering, session_of=self.session_of)
        self.turns: dict[str, Turn] = {}
        self.reservations: dict[str, Reservation] = {}
        self.holders: dict[tuple[str | None, str | None, str], str] = {}  # -> reservation id
        self.deadlines: dict[str, float] = {}  # wait deadlines (epoch), for queue.json
        self.lost_running: list[dict[str, str]] = []  # a dead supervisor's turns not yet gone
        self.on_finished: list[Callable[[Item], None]] = []
        self.on_flushed: list[Callable[[], None]] = []  # after each save and its events
        # Called with every event as it is emitted (before the batch is saved and published), so
        # an observer (supervisor.admission.control: rate windows, runtime limits, pause_on) sees a grant
        # before the next head is considered. An observer must be quick and must not emit.
        self.observers: list[Callable[[str, dict[str, Any]], None]] = []
        self.idle = asyncio.Event()
        self.idle.set()
        self._timers: dict[str, Timer] = {}
        self._pending: list[tuple[str, dict[str, Any]]] = []
        self._must_save = False
        self._dirty: set[str] = set()  # ids whose queue.json entry may have changed since the save
        self.save_error: OSError | None = None  # the last save's failure; None once one succeeds
        self.unsaved_ends: dict[str, str] = {}  # id -> key: finished, not yet in finished.log
        self._batch_depth = 0

    def get(self, item_id: str) -> Item | None:
        return self.turns.get(item_id) or self.reservations.get(item_id)

    def session_of(self, item_id: str) -> str:
        """The session a waiter counts in (supervisor.turns.fairness), from its holder."""
        item = self.get(item_id)
        if item is None:
            return f"i:{item_id}"
        return session_of(item.holder.session, item.holder.pid, item_id)

    def add(self, item: Item) -> None:
        if isinstance(item, Reservation):
            self.reservations[item.id] = item
            if item.holder_key:
                self.holders[item.holder_key] = item.id
        else:
            self.turns[item.id] = item
        self.idle.clear()

    # -- events ----------------------------------------------------------------------------------

    def apply(self, item: Item, event: Event, *, replay: bool = False, **fields: Any) -> None:
        """The one place an item changes state: advance, save if needed, publish (unless replay)."""
        item.advance(event)
        if replay:
            return
        if item.state.terminal:
            self._finish(item, fields.get("reason"))
        self._dirty.add(item.id)
        self._must_save |= event in PERSISTED
        self.emit(f"turn.{item.id}.{event.value}", {**item.fields(), **fields})

    def emit(self, topic: str, body: dict[str, Any]) -> None:
        self._pending.append((topic, body))
        for observe in self.observers:
            observe(topic, body)
        if not self._batch_depth:
            self._flush()

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Several changes, one save, then their events in order."""
        self._batch_depth += 1
        try:
            yield
        finally:
            self._batch_depth -= 1
            if not self._batch_depth:
                self._flush()

    def _flush(self) -> None:
        if self._must_save:
            self._must_save = False
            self.save()
        pending, self._pending = self._pending, []
        for topic, body in pending:
            self.publish(topic, body)
        for hook in self.on_flushed:
            hook()

    @property
    def in_batch(self) -> bool:
        return self._batch_depth > 0

    def _finish(self, item: Item, reason: str | None = None) -> None:
        self.turns.pop(item.id, None)
        if isinstance(item, Reservation) and self.reservations.pop(item.id, None) is not None:
            if item.holder_key and self.holders.get(item.holder_key) == item.id:
                del self.holders[item.holder_key]
        self.queue.remove(item.id)
        self.cancel_timer(item.id)
        self.deadlines.pop(item.id, None)
        if not self.finished.remember(item.id, item.state.value, _end_of(item, reason)):
            self.unsaved_ends[item.id] = item.key  # kept in `running` until finished.log has it
        for hook in self.on_finished:
            hook(item)
        if not self.turns and not self.reservations:
            self.idle.set()

    # -- timers ----------------------------------------------------------------------------------

    def call_later(self, item_id: str, delay: float, callback: Callable[[str], None]) -> None:
        """One timer per item (a new one replaces the old); dropped when the item finishes."""
        self.cancel_timer(item_id)

        def fire() -> None:
            self._timers.pop(item_id, None)
            callback(item_id)

        self._timers[item_id] = self.timers.call_later(max(delay, 0.0), fire)

    def cancel_timer(self, item_id: str) -> None:
        timer = self._timers.pop(item_id, None)
        if timer is not None:
            timer.cancel()

    # -- queue.json ------------------------------------------------------------------------------

    def save(self) -> bool:
        """Persist what changed since the last save: one journal append (see supervisor.turns.store).

        False when it could not be written (a full disk): what changed stays to be saved (by the
        next save, or `save_again` from the periodic duty), and `save_error` says why."""
        dirty, self._dirty = self._dirty, set()
        try:
            self.queue_file.update({item_id: self._entry(item_id) for item_id in dirty})
        except OSError as e:
            self._dirty |= dirty
            self._failed(e)
            return False
        self._saved()
        return True

    def changed(self, item_id: str) -> None:
        """The item's entry changed without an event (a held turn asked again,
        supervisor.turns.rerun): saved with the next save."""
        self._dirty.add(item_id)

    def save_first(self, item_id: str, entry: store.Entry) -> None:
        """Persist a new request's entry before anything of it is changed or published; OSError
        (nothing changed, in the files or here) when it cannot be: the request is refused."""
        self.queue_file.update({item_id: entry})

    def save_again(self) -> None:
        """The periodic duty: finished ids not yet in finished.log appended, unsaved changes saved."""
        appended = False
        for item_id in list(self.unsaved_ends):
            if not self.finished.append_again(item_id):
                break  # the disk is still full: the rest next time
            del self.unsaved_ends[item_id]
            self._dirty.add(item_id)  # its `running` entry may go now
            appended = True
        if self.save_error is not None or appended:
            self.save()

    def _failed(self, error: OSError) -> None:
        if self.save_error is None or self.save_error.errno != error.errno:
            log.error(
                "unable to save %s: %s (kept in memory and saved again when it can be; no guard "
                "starts until its grant is saved)",
                error.filename or self.queue_path,
                error.strerror,
            )
        self.save_error = error

    def _saved(self) -> None:
        if self.save_error is not None:
            log.info("%s is saved again", self.queue_path)
        self.save_error = None

    def save_all(self) -> None:
        """Persist everything acknowledged and unfinished, whole (a compaction: restore's end)."""
        ids = [*self.turns, *self.reservations, *(entry["id"] for entry in self.lost_running)]
        ids += self.unsaved_ends
        try:
            self.queue_file.replace({i: e for i in ids if (e := self._entry(i)) is not None})
        except OSError as e:
            self._dirty.update(ids)  # written by the next save that can be
            self._failed(e)
            return
        self._dirty.clear()
        self._saved()

    def _entry(self, item_id: str) -> store.Entry | None:
        """What queue.json holds for this id now: (section, item), or None when nothing."""
        turn = self.turns.get(item_id)
        if turn is not None:
            if turn.state is State.QUEUED and turn.held_until is None:
                return "waiting", turn.to_json(self.deadlines.get(turn.id))
            # granted (a held turn too: its env is not on file until it is asked again)
            return "running", turn.running_entry()
        reservation = self.reservations.get(item_id)
        if reservation is not None:
            return "reservations", reservation.to_json(self.deadlines.get(item_id))
        for entry in self.lost_running:
            if entry["id"] == item_id:
                return "running", entry
        key = self.unsaved_ends.get(item_id)
        if key is not None:  # its end is not in finished.log: a restart must end it, not forget it
            return "running", {"id": item_id, "key": key}
        return None


def _end_of(item: Item, reason: str | None) -> dict[str, Any] | None:
    """A turn's end as finished.log keeps it (supervisor.turns.finished): enough for a later
    supervisor to write the history's `exited` and terminal event when they were lost."""
    if not isinstance(item, Turn):
        return None  # reservations have no history
    end: dict[str, Any] = {"key": item.key}
    if item.exit is not None:
        end["exit"] = dict(item.exit)
        end["exited_at"] = item.exited_at
    if item.stop_reason is not None:
        end["stop_reason"] = item.stop_reason
    if reason is not None:
        end["reason"] = reason
    return end
