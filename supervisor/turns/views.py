"""What `ps` and `status` answer: the slots as the gate reads them, the waiters in order, counts.

Knows the manager's items and queue and the gate's views; changes nothing.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..wire import requester as requester_names
from .states import Reservation, State, Turn

if TYPE_CHECKING:
    from .manager import Manager


def ps(manager: Manager) -> dict[str, Any]:
    """`slots`: the slots taken (free ones are only counted, in `slot_keys`: one tally per key,
    see SlotReader.survey); `waits`: every waiter in order; `keys`: admission's view of keys."""
    taken, tallies = manager.gate.survey()
    slots = [view.to_json() for view in taken]
    for slot in slots:  # who asked for the turn, beside the lock holder (the supervisor)
        asking = manager.ledger.get(slot.get("turn") or "")
        slot["requester"] = requester_names.requester(asking.holder.pid) if asking else None
        if isinstance(asking, Turn):  # the live turn's command, before its work is recorded too
            slot["argv"], slot["cwd"] = asking.argv, asking.cwd
            if asking.member is not None:  # asked for a pool: this slot is its member's
                slot["pool"], slot["member"] = asking.key, asking.member
            # Taken over from a supervisor that was gone (turn.<id>.adopted): when, and the gap.
            slot.setdefault("adopted_at", asking.adopted_at)
            slot.setdefault("adoption_gap_s", asking.adoption_gap)
            # Its age counts from its start: the slot record is rewritten at an adoption.
            started = manager.endings.started_at(asking.id)
            if started is not None:
                slot["since"] = started
    waits = []
    position, last_key = 0, None
    for waiter in manager.queue.all():  # each key's waiters together, oldest first
        item = manager.ledger.get(waiter.id)
        assert item is not None
        position = position + 1 if waiter.key == last_key else 1  # what queue.position says
        last_key = waiter.key
        waits.append(
            {
                "id": waiter.id,
                "key": waiter.key,
                "position": position,
                "since": waiter.requested_at,
                "holder": item.holder.to_json(),
                "requester": requester_names.requester(item.holder.pid),
                "reservation": isinstance(item, Reservation),
                "argv": item.argv if isinstance(item, Turn) else None,
                "cwd": item.cwd if isinstance(item, Turn) else None,
                "why": _why(manager, waiter.key, position),
                # granted before a crash, never started: until when it waits for its requester
                # to ask again by its id (supervisor.turns.rerun)
                "held_until": item.held_until if isinstance(item, Turn) else None,
            }
        )
    return {"slots": slots, "slot_keys": tallies, "waits": waits, "keys": _keys(manager)}


def _why(manager: Manager, key: str, position: int | None) -> Any:
    """Why a waiter waits (supervisor.admission.control), when the manager's admission can say."""
    waits_why = getattr(manager.admission, "waits_why", None)
    return waits_why(key, position, manager.refused.get(key)) if waits_why else None


def _keys(manager: Manager) -> list[Any]:
    """Paused keys, rate windows and why each key's head waits (supervisor.admission.control),
    each with its cap (a paused key that has not run yet has no slot tally to say it)."""
    keys_view = getattr(manager.admission, "keys_view", None)
    entries = keys_view(manager.queue.keys_by_age(), manager.refused) if keys_view else []
    caps = getattr(manager.gate, "caps", None)
    for entry in entries:
        if caps is not None and not str(entry.get("key", "_")).startswith("_"):
            entry.setdefault("cap", caps.cap_for(entry["key"]))
    return entries


def status(manager: Manager) -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "version": __version__,
        "state_dir": str(manager.paths.root),
        "started_at": manager.started_at,
        "config": manager.settings.config_source,
        "turns": sum(1 for t in manager.turns.values() if t.state is not State.QUEUED),
        "waits": len(manager.queue),
        "reservations": sum(1 for r in manager.reservations.values() if r.state is State.GRANTED),
        "stopping": manager.stopping,
        "keys": _keys(manager),
        "adopt_within": manager.settings.adopt_within,
        "adopted": manager.adoption.adopted,  # turns adopted at this supervisor's start
    }
