"""Requesters: the processes that asked for turns and reservations, watched until they are gone.

A request may name its requester's pid (and start ticks; without them they are read at request
time). Each requester is watched once, by a pidfd on the event loop, however many items it asked
for; when it dies, `on_gone` is called for each of its items (sorted by id), and the manager
cancels them through the turn's ending table. An item that finishes is unwatched; the pidfd is
closed with the last one.

Knows pids, start ticks and pidfds; nothing of turns, slots or queues (items are ids). Nothing is
persisted: a restored item names its requester again and is watched anew (`restored`).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

from guardd import procs
from guardd.procs import Identity

from ..holder import Holder
from ..wire.protocol import ProtocolError

GONE = False  # `restored` says so when a saved item's requester has died since


class Requesters:
    def __init__(self, on_gone: Callable[[str], None]):
        self.on_gone = on_gone
        self._watched: dict[Identity, tuple[int, set[str]]] = {}  # ident -> (pidfd, item ids)

    def identify(self, holder: Holder) -> Identity | None:
        """The requester a new request names, or None; ProtocolError when it is not running."""
        if holder.pid is None:
            return None
        start = holder.start if holder.start is not None else procs.start_ticks(holder.pid)
        ident = Identity(holder.pid, start) if start is not None else None
        if ident is None or not procs.process_running(ident):
            raise ProtocolError("bad_request", f"the requester (pid {holder.pid}) is not running")
        return ident

    def restored(self, holder: Holder) -> Identity | None | bool:
        """A saved item's requester: its identity, None when none was named, GONE when dead."""
        if holder.pid is None:
            return None
        ident = Identity(holder.pid, holder.start) if holder.start is not None else None
        return ident if ident is not None and procs.process_running(ident) else GONE

    def watch(self, ident: Identity, item_id: str) -> bool:
        """Watch ident for item_id; False (nothing watched) when it is already gone."""
        entry = self._watched.get(ident)
        if entry is None:
            try:
                pidfd: int | None = os.pidfd_open(ident.pid)
            except ProcessLookupError:
                pidfd = None
            if pidfd is not None and not procs.process_running(ident):
                os.close(pidfd)
                pidfd = None
            if pidfd is None:
                return False
            entry = (pidfd, set())
            self._watched[ident] = entry
            asyncio.get_running_loop().add_reader(pidfd, self._gone, ident)
        entry[1].add(item_id)
        return True

    def unwatch(self, ident: Identity | None, item_id: str) -> None:
        entry = self._watched.get(ident) if ident is not None else None
        if entry is None or ident is None:
            return
        entry[1].discard(item_id)
        if not entry[1]:
            self._close(ident)

    def close(self) -> None:
        for ident in list(self._watched):
            self._close(ident)

    def _close(self, ident: Identity) -> None:
        pidfd, _ = self._watched.pop(ident)
        asyncio.get_running_loop().remove_reader(pidfd)
        os.close(pidfd)

    def _gone(self, ident: Identity) -> None:
        entry = self._watched.get(ident)
        if entry is None:
            return
        for item_id in sorted(entry[1]):
            self.on_gone(item_id)
        if ident in self._watched:
            self._close(ident)
