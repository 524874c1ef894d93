"""Admission: the policy asked before each grant, "may this key's head be granted now?".

The manager asks `Admission.refusal(item, now)` for the head of each key's queue, oldest head
first, before it asks the slot gate; a Refusal holds that key back (its reason, and until when if
known: None means until something changes) and the manager goes on to the next key. A refused
head is asked again at the next grant round (every slot freed, every request, and `tick`).
The default admits everything: the cap (the slot gate) is then the only limit. Pauses, start-rate
windows and other policies implement this protocol; nothing else in the grant path changes.

Knows nothing: a policy gets the waiting item and the time, and answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .turns import Item


@dataclass(frozen=True)
class Refusal:
    """Why a key's head may not be granted now, and until when (None: until something changes)."""

    reason: str
    until: float | None = None


class Admission(Protocol):
    def refusal(self, item: Item, now: float) -> Refusal | None: ...


class AdmitAll:
    def refusal(self, item: Item, now: float) -> Refusal | None:
        return None
