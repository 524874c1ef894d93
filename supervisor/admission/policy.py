"""The admission policy: may the head of a key's queue be granted now; if not, why and until when.

Design note. Capacity (the flock slots, the machine cap, the memory floor) is decided by the slot
gate; everything that depends on time is decided here, before the gate is tried: a pause
(supervisor.admission.pauses), a provider window at or past `[quota] hold_at`
(supervisor.admission.quota) and the start rate (supervisor.admission.rates). `hold(key, now)` answers None (try the
gate) or a Why; `refused(key, refusal, now)` turns the gate's refusal into a Why; `granted(key, now)`
counts the grant in the key's rate window. Only the head of a key's queue is ever asked: when it
waits, everyone behind it waits too (`behind`), so a rate or a pause never lets a later waiter
jump ahead. A hold's Why says until when, for the caller to set a timer instead of polling.

The Why of each key's head is kept (`why(key)`) so `ps` and `status` can say why each waiter
waits and, where it can be known, from when a grant is possible: the end of a pause, the opening
of the rate window. A full key, the machine cap or the memory floor have no known time (a runtime
limit of the running turns would bound it, and the caller may pass that as `free_by`).

The clock is the caller's `now` (epoch seconds): a test replays histories without waiting.
Knows pauses, quota windows, rates and the gate's refusal words; nothing of turns, files or sockets.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from typing import TypedDict

from .pauses import PauseBook
from .quota import DEFAULT_HOLD_AT, QuotaBook, Window, describe
from .rates import RateTable, StartWindows


class WaitReason(enum.Enum):
    BEHIND = "behind"  # not the head of its key: waits for the ones ahead of it
    KEY_FULL = "key_full"
    PAUSED = "paused"
    RATE = "rate"
    MACHINE_CAP = "machine_cap"
    MEMORY_FLOOR = "memory_floor"
    UNREADABLE = "unreadable"  # a slot record that cannot be read counts as taken
    CHECKING_OUTPUT = "checking_output"  # an ended turn's stderr is being matched (pause_on)
    QUOTA = "quota"  # a provider window of the key is at or past [quota] hold_at, or rejected
    MEMORY = "memory"  # the key's predicted peak does not fit in the [memory] budget's room
    PRESSURE = "pressure"  # PSI memory `some avg10` is at or above [memory] pressure
    REQUESTER = (
        "requester"  # granted before a crash, its guard never started: held for its requester
    )


# The slot gate's `last_refusal` words.
_REFUSALS = {
    "key_full": WaitReason.KEY_FULL,
    "machine_full": WaitReason.MACHINE_CAP,
    "low_memory": WaitReason.MEMORY_FLOOR,
    "unreadable": WaitReason.UNREADABLE,
}


class WhyJSON(TypedDict):
    reason: str
    until: float | None
    detail: str


@dataclass(frozen=True)
class Why:
    reason: WaitReason
    until: float | None  # from when a grant is possible, when that can be known
    detail: str

    def to_json(self) -> WhyJSON:
        return {"reason": self.reason.value, "until": self.until, "detail": self.detail}


class Admission:
    def __init__(
        self,
        pauses: PauseBook,
        starts: StartWindows,
        quota: QuotaBook | None = None,
        hold_at: float = DEFAULT_HOLD_AT,
    ):
        self.pauses = pauses
        self.starts = starts
        self.quota = quota if quota is not None else QuotaBook()
        self.hold_at = hold_at
        self._why: dict[str, Why] = {}

    @classmethod
    def empty(cls) -> Admission:
        return cls(PauseBook(), StartWindows(RateTable()))

    def hold(self, key: str, now: float) -> Why | None:
        """Why the head of `key` may not be granted at `now` for a reason of time, else None."""
        pause = self.pauses.covering(key, now)
        if pause is not None:
            by = f" (paused as {pause.key})" if pause.key != key else ""
            why = f": {pause.reason}" if pause.reason else ""
            return self._note(key, Why(WaitReason.PAUSED, pause.until, f"paused{by}{why}"))
        window = self.quota_hold(key, now)
        if window is not None:
            return self._note(key, quota_why(window))
        opens = self.starts.next_allowed(key, now)
        if opens is not None:
            rate = self.starts.table.rate_for(key)
            return self._note(key, Why(WaitReason.RATE, opens, f"start rate {rate} reached"))
        return None

    def quota_hold(self, key: str, now: float) -> Window | None:
        """The window of `key` at or past `hold_at` that resets last, or None: the key has
        quota room at `now` (a pool asks this of each member)."""
        return self.quota.holding(key, now, self.hold_at)

    def refused(self, key: str, refusal: str | None, free_by: float | None = None) -> Why:
        """The gate refused the head of `key` (`SlotGate.last_refusal`): noted, and returned."""
        return self._note(key, gate_why(refusal, free_by))

    def granted(self, key: str, now: float) -> None:

        self.starts.record(key, now)
        self._why.pop(key, None)

    def forget(self, key: str) -> None:
        """The key has no waiter any more."""
        self._why.pop(key, None)

    def why(self, key: str) -> Why | None:
        """Why the head of `key` waited at its last try (None: not tried, or granted)."""
        return self._why.get(key)

    def behind(self, key: str, position: int, head: Why | None = None) -> Why:
        """Why a waiter at `position` (> 1) waits: the ones ahead, and no sooner than the head
        (whose Why is `head`, else the one noted for the key)."""
        head = head if head is not None else self._why.get(key)
        ahead = position - 1
        detail = f"{ahead} waiter{'s' if ahead != 1 else ''} of the key ahead"
        if head is not None:
            detail += f"; the head waits: {head.detail}"
        return Why(WaitReason.BEHIND, head.until if head else None, detail)

    def note(self, key: str, why: Why) -> Why:
        """Remember why the head of `key` waits (for a hold decided by the caller)."""
        return self._note(key, why)

    def _note(self, key: str, why: Why) -> Why:
        self._why[key] = why
        return why


def quota_why(window: Window) -> Why:
    """Why a head waits for a window of its key to reset."""
    clock = time.strftime("%H:%M:%S", time.localtime(window.resets_at))
    return Why(WaitReason.QUOTA, window.resets_at, f"quota: {describe(window, clock)}")


def gate_why(refusal: str | None, free_by: float | None = None) -> Why:
    """Why a head waits when the slot gate refused it (`SlotGate.last_refusal`'s word)."""
    reason = _REFUSALS.get(refusal or "key_full", WaitReason.KEY_FULL)
    detail = {
        WaitReason.KEY_FULL: "every slot of the key is taken",
        WaitReason.MACHINE_CAP: "the machine cap is reached",
        WaitReason.MEMORY_FLOOR: "free memory is below min_free_memory",
        WaitReason.UNREADABLE: "a slot record cannot be read (it counts as taken)",
    }[reason]
    return Why(reason, free_by if reason is WaitReason.KEY_FULL else None, detail)
