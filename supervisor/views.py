"""What `ps` and `status` answer: the slots as the gate reads them, the waiters in order, counts.

Knows the manager's items and queue and the gate's views; changes nothing.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from . import __version__
from .turns import Reservation, State

if TYPE_CHECKING:
    from .manager import Manager


def ps(manager: Manager) -> dict[str, Any]:
    slots = [view.to_json() for view in manager.gate.inspect_all()]
    waits = []
    for waiter in manager.queue.all():
        item = manager.ledger.get(waiter.id)
        assert item is not None
        waits.append(
            {
                "id": waiter.id,
                "key": waiter.key,
                "position": manager.queue.position(waiter.id),
                "since": waiter.requested_at,
                "holder": item.holder.to_json(),
                "reservation": isinstance(item, Reservation),
            }
        )
    return {"slots": slots, "waits": waits}


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
    }
