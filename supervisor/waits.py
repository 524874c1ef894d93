"""The fair wait queue: per cap key, oldest first (request time, then id).

A new request never jumps older waiters of its key, even when it sees a free slot: the caller
grants only the head of a key. Keys are independent: a full key blocks only its own waiters.
`keys_by_age()` orders keys by the age of their head, so a slot of the shared machine cap goes to
the oldest waiter of any key.

In memory only; the daemon persists what it must. Knows ordering, nothing of slots or processes.
The ordering is replaceable: the manager takes any `Queue` in its constructor (a fairness across
sessions, say, orders each key's waiters differently behind the same methods).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, order=True)
class Waiter:
    requested_at: float
    id: str
    key: str


class Queue(Protocol):
    """What the manager, the ledger and restore use of a wait queue."""

    def __len__(self) -> int: ...
    def __contains__(self, item_id: str) -> bool: ...
    def add(self, key: str, item_id: str, requested_at: float) -> int: ...
    def replace(self, old_id: str, new_id: str) -> None: ...
    def remove(self, item_id: str) -> bool: ...
    def head(self, key: str) -> str | None: ...
    def position(self, item_id: str) -> int | None: ...
    def keys_by_age(self) -> list[str]: ...
    def all(self) -> list[Waiter]: ...


class WaitQueue:
    def __init__(self) -> None:
        self._by_key: dict[str, list[Waiter]] = {}
        self._by_id: dict[str, Waiter] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, item_id: str) -> bool:
        return item_id in self._by_id

    def add(self, key: str, item_id: str, requested_at: float) -> int:
        """Queue an item; returns its position (1 = next)."""
        if item_id in self._by_id:
            raise ValueError(f"{item_id} is already waiting")
        waiter = Waiter(requested_at, item_id, key)
        bisect.insort(self._by_key.setdefault(key, []), waiter)
        self._by_id[item_id] = waiter
        return bisect.bisect_left(self._by_key[key], waiter) + 1

    def replace(self, old_id: str, new_id: str) -> None:
        """new_id takes old_id's place (a turn binding a reservation that still waits)."""
        old = self._by_id.pop(old_id)
        waiters = self._by_key[old.key]
        new = Waiter(old.requested_at, new_id, old.key)
        waiters[waiters.index(old)] = new
        waiters.sort()
        self._by_id[new_id] = new

    def remove(self, item_id: str) -> bool:
        waiter = self._by_id.pop(item_id, None)
        if waiter is None:
            return False
        waiters = self._by_key[waiter.key]
        waiters.remove(waiter)
        if not waiters:
            del self._by_key[waiter.key]
        return True

    def head(self, key: str) -> str | None:
        waiters = self._by_key.get(key)
        return waiters[0].id if waiters else None

    def position(self, item_id: str) -> int | None:
        waiter = self._by_id.get(item_id)
        if waiter is None:
            return None
        return bisect.bisect_left(self._by_key[waiter.key], waiter) + 1

    def keys_by_age(self) -> list[str]:
        return sorted(self._by_key, key=lambda k: self._by_key[k][0])

    def all(self) -> list[Waiter]:
        """Every waiter, keys in order of their heads' age, each key oldest first."""
        return [w for key in self.keys_by_age() for w in self._by_key[key]]
