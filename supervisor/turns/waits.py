"""The fair wait queue: per cap key, in the order of supervisor.turns.fairness (by default oldest first,
request time then id; with `[slots] fairness = "session"`, round-robin across sessions).

A new request never jumps older waiters of its key, even when it sees a free slot: the caller
grants only the head of a key. Keys are independent: a full key blocks only its own waiters.
`keys_by_age()` orders keys by the age of their head, so a slot of the shared machine cap goes to
the oldest waiter of any key.

In memory only; the daemon persists what it must. Knows ordering, nothing of slots or processes.
The ordering is replaceable: the manager is given an `Ordering` and the ledger makes the queue with
it (a fairness across sessions, say, orders each key's waiters differently behind the same
methods); `Queue` is what the manager, the ledger and restore use of it.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from .fairness import FifoOrdering, Ordering


@dataclass(frozen=True, order=True)
class Waiter:
    rank: tuple  # supervisor.turns.fairness: what a key's waiters are sorted by
    requested_at: float = field(compare=False)
    id: str = field(compare=False)
    key: str = field(compare=False)
    session: str = field(compare=False, default="")


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
    def __init__(
        self,
        ordering: Ordering | None = None,
        session_of: Callable[[str], str] | None = None,
    ) -> None:
        """`ordering` ranks each key's waiters (default FIFO); `session_of(item_id)` names the
        session a waiter counts in (supervisor.turns.fairness.session_of), asked when it is added."""
        self._by_key: dict[str, list[Waiter]] = {}
        self._by_id: dict[str, Waiter] = {}
        self.ordering: Ordering = ordering or FifoOrdering()
        self.session_of = session_of or (lambda item_id: f"i:{item_id}")

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, item_id: str) -> bool:
        return item_id in self._by_id

    def add(self, key: str, item_id: str, requested_at: float) -> int:
        """Queue an item; returns its position (1 = next)."""
        if item_id in self._by_id:
            raise ValueError(f"{item_id} is already waiting")
        session = self.session_of(item_id)
        rank = self.ordering.rank(key, item_id, session, requested_at)
        waiter = Waiter(rank, requested_at, item_id, key, session)
        bisect.insort(self._by_key.setdefault(key, []), waiter)
        self._by_id[item_id] = waiter
        return bisect.bisect_left(self._by_key[key], waiter) + 1

    def replace(self, old_id: str, new_id: str) -> None:
        """new_id takes old_id's place (a turn binding a reservation that still waits)."""
        old = self._by_id.pop(old_id)
        waiters = self._by_key[old.key]
        new = Waiter(old.rank, old.requested_at, new_id, old.key, old.session)
        self.ordering.renamed(old_id, new_id)
        waiters[waiters.index(old)] = new
        waiters.sort()
        self._by_id[new_id] = new

    def remove(self, item_id: str) -> bool:
        waiter = self._by_id.pop(item_id, None)
        if waiter is None:
            return False
        waiters = self._by_key[waiter.key]
        # Found by its rank, not by list.remove: that compared every waiter before it, O(queue)
        # per leaving waiter (3 ms of a cancel's 3.5 at 3,000 waiters).
        index = bisect.bisect_left(waiters, waiter)
        while waiters[index] is not waiter:  # waiters of an equal rank: the one that is this
            index += 1
        del waiters[index]
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
        def age(key: str) -> tuple[float, str]:
            head = self._by_key[key][0]
            return (head.requested_at, head.id)

        return sorted(self._by_key, key=age)

    def reorder(self, ordering: Ordering) -> None:
        """A new fairness (a reload): every waiter ranked again, in its current order."""
        waiters = self.all()
        self._by_key, self._by_id, self.ordering = {}, {}, ordering
        for w in waiters:
            self.add(w.key, w.id, w.requested_at)

    def all(self) -> list[Waiter]:
        """Every waiter, keys in order of their heads' age, each key oldest first."""
        return [w for key in self.keys_by_age() for w in self._by_key[key]]
