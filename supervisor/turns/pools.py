"""Account pools: a turn asked for a pool's name runs on one of its members (`[pools]`).

Design note. A pool is a key with a wait queue of its own and no slots: its waiters wait in the
pool's queue (`queue.json` keeps them there, in their place, across a restart), and the head is
granted on the first member, in the order written, that admits it: not paused (the pool's own name
or the member), within its start rate, with quota room (the manager's `quota_room(key, now)`), and
with a free slot in the member's flock gate. The slot is the member's: its record names the member
key, so the cap of the member holds for every process on the machine, whoever asked (a pool's turn,
a direct turn of the member, another program using supervisor.slots), and a restarted supervisor
adopts a running pool turn on its member (queue.json's `running` entry names `member`).

Fairness between a member's direct waiters and the pool's waiters: oldest first across both. The
manager's grant pass takes the heads of all keys oldest first (request time, then id), so when a
member's slot frees, the older of (the member's direct head, the pool's head) is tried first; the
pool's head takes the first member of the pool that is free at that moment, which may be another
member than the one that freed. Rejected: a priority for direct waiters (a pool would starve
behind a member that is asked for directly all day) or for the pool (a direct caller who named an
account would wait behind every pool turn); and reserving a member for the pool's head when it is
older but that member is not its first free choice (it costs idle slots for no gain in order).

A pool's waiter shows why it waits: `key_full` when every member is full (or the machine cap, the
memory floor), else the reason of the first member (paused, rate, quota, ...) with the soonest end
known among the members. Reservations name a member, never a pool (a reservation holds one slot of
one key). Members are this machine's keys: a cluster key is refused as a member by the config.

Knows members and refusal words; nothing of slots, processes or the queue's order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

# The gate's words: a member without a free slot. Any of them makes the pool wait for a slot to
# free; no end is known then.
_NO_SLOT = ("key_full", "machine_full", "low_memory", "unreadable")


class Refused(Protocol):
    """A member's refusal as the manager notes it (supervisor.turns.manager.Refusal)."""

    @property
    def reason(self) -> str: ...

    @property
    def until(self) -> float | None: ...


def why_pool_waits(
    members: Sequence[str], refusals: Sequence[Refused]
) -> tuple[str, float | None, str]:
    """(reason, until, detail) of a pool whose head no member would take; `refusals` in the
    order of `members`."""
    parts = [f"{m}: {r.reason}" for m, r in zip(members, refusals, strict=True)]
    detail = "no member of the pool can take it (" + ", ".join(parts) + ")"
    for refusal in refusals:
        if refusal.reason in _NO_SLOT:
            return ("key_full" if refusal.reason == "unreadable" else refusal.reason, None, detail)
    ends = [r.until for r in refusals if r.until is not None]
    reason = refusals[0].reason if refusals else "key_full"
    # the pool may be granted when the first of its members' holds ends (none known: None)
    until = min(ends) if len(ends) == len(refusals) and ends else None
    return (reason, until, detail)
