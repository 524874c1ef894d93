"""A turn's states and the one table of its transitions.

    new --queued--> queued --granted--> granted --started--> running --exited--> exited --gone--> gone
                      |                    |                   |                                 |
                      +--cancelled-->      +--exited-->        +--stopping--> stopping --gone--> +--released-->
    new --rejected-->                                                 (exited may come while stopping)

Every event is named by its bus topic suffix: applying event E publishes `turn.<id>.E`, so the
table is also the order in which a subscriber sees a turn's events. A pair missing from the table
is a bug in the caller and raises IllegalTransition; it is never silently ignored.

Restore replays a saved item's past events through this same table (without publishing them
again), so no code anywhere sets a state directly.

Knows states and events; nothing of slots, processes or sockets (it names their types only).
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from guardd.procs import Group, Identity

from ..holder import Holder

if TYPE_CHECKING:
    from ..slots.gate import Slot
    from .seams import Guard


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


# A reservation holds a slot for a holder before its work exists. It speaks on the same topics as
# a turn (it is a turn-to-be): queued, granted (slot held until `until`), then released (expired,
# cancelled, or bound: its slot handed to the turn that named it), or cancelled while waiting.
RESERVATION_TRANSITIONS: dict[tuple[State, Event], State] = {
    (State.NEW, Event.QUEUED): State.QUEUED,
    (State.QUEUED, Event.GRANTED): State.GRANTED,
    (State.QUEUED, Event.CANCELLED): State.CANCELLED,
    (State.GRANTED, Event.RELEASED): State.RELEASED,
}


class IllegalTransition(RuntimeError):
    pass


class Outcome(TypedDict):
    """CMD's outcome as `turn.<id>.exited` gives it: code as a shell reports it (128+N). When CMD
    could not start: reason `not_found` or `not_executable`, and `error`, the line a shell would
    print (`nosuchcmd: command not found`)."""

    code: int | None
    signal: int | None
    reason: str | None
    error: NotRequired[str]


def next_state(
    state: State,
    event: Event,
    table: dict[tuple[State, Event], State] = TRANSITIONS,
    what: str = "turn",
) -> State:
    try:
        return table[(state, event)]
    except KeyError:
        raise IllegalTransition(
            f"a {what} in state {state.value} cannot take event {event.value}"
        ) from None


@dataclass
class Turn:
    """One request to run argv under a cap key, from request to its terminal event."""

    id: str
    key: str
    argv: list[str]
    cwd: str | None
    env: dict[str, str | None]  # never written to records, logs or events
    holder: Holder
    requested_at: float = field(default_factory=time.time)
    wait_timeout: float | None = None
    reservation: str | None = None
    timeout: float | None = None  # its own runtime limit (supervisor.admission.runtime_limits)
    env_replace: bool = False  # env is its whole environment, not added to the supervisor's
    stdin: str = "pipe"  # supervisor.wire.args.STDIN_MODES
    winsize: tuple[int, int] | None = None  # a "tty" turn's terminal at its start
    state: State = State.NEW
    exit: Outcome | None = None  # once known
    exited_at: float | None = None  # epoch: when CMD ended (its guard's record), once known
    stop_reason: str | None = None
    slot: Slot | None = None  # while granted
    guard: Guard | None = None  # once started
    logs_asked: bool = False  # its log directory and files were asked of the file thread
    record_dropped: bool = False  # its guard's record (and spare) were given to the file thread
    requester: Identity | None = None  # when watched
    groups_seen: set[Group] = field(default_factory=set)  # published as turn.<id>.group
    followed: bool = True  # False when the guard runs but its pipes and exit could not be watched
    leftovers_told: bool = False  # turn.<id>.leftovers published (from its guard's record)
    # stdin sent while the guard is being started (granted, not yet running): handed to the guard
    # the moment it runs, so an acknowledged `send` is never lost to the start's timing
    early_stdin: bytearray = field(default_factory=bytearray)
    early_eof: bool = False
    # Adopted from a supervisor that died or handed over (supervisor.turns.adopt): when, and how
    # long it ran with no supervisor.
    adopted_at: float | None = None
    adoption_gap: float | None = None
    # At a hand-over (`ccsup restart`): each stream's byte offset published so far, saved with
    # its `running` entry for the supervisor that adopts it
    offsets: dict[str, int] | None = None
    # Asked for a pool (`key` is the pool's name): the member it was granted on (supervisor.turns.pools)
    member: str | None = None
    # Granted by a supervisor that died before its guard started (supervisor.turns.rerun): held
    # at its key's head until its requester asks again by the same id, at most until then (epoch)
    held_until: float | None = None

    def advance(self, event: Event) -> State:
        self.state = next_state(self.state, event)
        return self.state

    @property
    def slot_key(self) -> str:
        """The key whose slot it holds, and whose rules apply to it: its member, else its key."""
        return self.member or self.key

    def running_entry(self) -> dict[str, Any]:
        """queue.json's `running` entry of a granted turn: what a supervisor that adopts it after a
        restart needs to go on with it (supervisor.turns.adopt); never its env."""
        return {
            "id": self.id,
            "key": self.key,
            "argv": self.argv,
            "cwd": self.cwd,
            "holder": self.holder.to_json(),
            "requested_at": self.requested_at,
            "timeout": self.timeout,
            "stdin": self.stdin,
            **({} if self.member is None else {"member": self.member}),
            # a hand-over's: where each stream's events go on (supervisor.turns.adopt reads it)
            **({} if self.offsets is None else {"offsets": dict(self.offsets)}),
        }

    def fields(self) -> dict[str, Any]:
        """What events and ps say about the turn: never its environment."""
        return {"id": self.id, "key": self.key}

    def to_json(self, wait_deadline: float | None) -> dict[str, Any]:
        """A waiting turn's entry (the env goes to a file of its own: supervisor.turns.store)."""
        return {
            "id": self.id,
            "key": self.key,
            "argv": self.argv,
            "cwd": self.cwd,
            "env": self.env,
            "holder": self.holder.to_json(),
            "requested_at": self.requested_at,
            "wait_deadline": wait_deadline,
            "reservation": self.reservation,
            "timeout": self.timeout,
            "env_replace": self.env_replace,
            "stdin": self.stdin,
            "winsize": None if self.winsize is None else list(self.winsize),
        }


@dataclass
class Reservation:
    """A slot held for a holder (session + agent) before its work exists."""

    id: str
    key: str
    holder: Holder
    requested_at: float = field(default_factory=time.time)
    wait_timeout: float | None = None
    state: State = State.NEW
    until: float | None = None  # epoch seconds, once granted
    slot: Slot | None = None
    requester: Identity | None = None

    def advance(self, event: Event) -> State:
        self.state = next_state(self.state, event, RESERVATION_TRANSITIONS, "reservation")
        return self.state

    def fields(self) -> dict[str, Any]:
        return {"id": self.id, "key": self.key, "reservation": True}

    @property
    def holder_key(self) -> tuple[str | None, str | None, str] | None:
        """One reservation per holder and key; a holder with neither session nor agent is anonymous."""
        if self.holder.session is None and self.holder.agent is None:
            return None
        return (self.holder.session, self.holder.agent, self.key)

    def to_json(self, wait_deadline: float | None) -> dict[str, Any]:
        return {
            "id": self.id,
            "key": self.key,
            "holder": self.holder.to_json(),
            "requested_at": self.requested_at,
            "wait_deadline": wait_deadline,
            "state": self.state.value,
            "until": self.until,
        }


Item = Turn | Reservation  # what waits in the queue and speaks on turn.<id>.*
