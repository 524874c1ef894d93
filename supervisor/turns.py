"""A turn's states and the one table of its transitions.

    new --queued--> queued --granted--> granted --started--> running --exited--> exited --gone--> gone
                      |                    |                   |                                 |
                      +--cancelled-->      +--exited-->        +--stopping--> stopping --gone--> +--released-->
    new --rejected-->                                                 (exited may come while stopping)

Every event is named by its bus topic suffix: applying event E publishes `turn.<id>.E`, so the
table is also the order in which a subscriber sees a turn's events. A pair missing from the table
is a bug in the caller and raises IllegalTransition; it is never silently ignored.

Knows states and events; nothing of slots, processes or sockets.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from .protocol import HolderInfo


class State(enum.Enum):
    NEW = "new"
    QUEUED = "queued"
    GRANTED = "granted"
    RUNNING = "running"
    EXITED = "exited"
    STOPPING = "stopping"
    GONE = "gone"
    RELEASED = "released"
    CANCELLED = "cancelled"
    REJECTED = "rejected"

    @property
    def terminal(self) -> bool:
        return self in (State.RELEASED, State.CANCELLED, State.REJECTED)


class Event(enum.Enum):
    QUEUED = "queued"
    REJECTED = "rejected"
    GRANTED = "granted"
    CANCELLED = "cancelled"
    STARTED = "started"
    EXITED = "exited"
    STOPPING = "stopping"
    GONE = "gone"
    RELEASED = "released"


TRANSITIONS: dict[tuple[State, Event], State] = {
    (State.NEW, Event.QUEUED): State.QUEUED,
    (State.NEW, Event.REJECTED): State.REJECTED,
    (State.QUEUED, Event.GRANTED): State.GRANTED,
    (State.QUEUED, Event.CANCELLED): State.CANCELLED,
    (State.GRANTED, Event.STARTED): State.RUNNING,
    (State.GRANTED, Event.EXITED): State.EXITED,  # the guard could not be started
    (State.RUNNING, Event.EXITED): State.EXITED,
    (State.RUNNING, Event.STOPPING): State.STOPPING,
    (State.STOPPING, Event.EXITED): State.STOPPING,
    (State.EXITED, Event.GONE): State.GONE,
    (State.STOPPING, Event.GONE): State.GONE,
    (State.GONE, Event.RELEASED): State.RELEASED,
}


class IllegalTransition(RuntimeError):
    pass


def next_state(state: State, event: Event) -> State:
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise IllegalTransition(f"a turn in state {state.value} cannot take event {event.value}") from None


@dataclass
class Turn:
    """One request to run argv under a cap key, from request to its terminal event."""

    id: str
    key: str
    argv: list[str]
    cwd: str | None
    env: dict  # never written to records, logs or events
    holder: HolderInfo
    requested_at: float = field(default_factory=time.time)
    wait_timeout: float | None = None
    reservation: str | None = None
    state: State = State.NEW
    exit: dict | None = None  # {"code","signal","reason"} once known
    stop_reason: str | None = None
    slot: object = None  # supervisor.slots.Slot while granted
    guard: object = None  # supervisor.spawn.Guard once started
    requester: object = None  # guardd.procs.Identity of the requester, when watched
    groups_seen: set = field(default_factory=set)  # groups already published as turn.<id>.group

    def advance(self, event: Event) -> State:
        self.state = next_state(self.state, event)
        return self.state

    def fields(self) -> dict:
        """What events and ps say about the turn: never its environment."""
        return {"id": self.id, "key": self.key}
