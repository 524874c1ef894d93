"""Who holds a slot, or asks for one: a process (pid + start ticks) and the labels it was asked with.

One type for both uses. In a request (protocol), `pid`/`start` name the requester, are optional,
and are watched when given. In a slot record (slots), they name the process that holds the lock
and are always set: the supervisor records `holder.held_by(its own identity)`, keeping the
requester's labels. Knows the fields and their JSON; nothing of validation of wire input (protocol
does that) or of locks.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from guardd import procs

from .errors import CcsupError

LABELS = ("session", "agent", "harness", "model", "effort", "mode")


@dataclass(frozen=True)
class Holder:
    pid: int | None = None
    start: int | None = None  # start ticks (field 22 of /proc/<pid>/stat)
    session: str | None = None
    agent: str | None = None
    harness: str | None = None
    model: str | None = None
    effort: str | None = None
    mode: str | None = None

    def labels(self) -> dict[str, str | None]:
        return {name: getattr(self, name) for name in LABELS}

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "start": self.start, **self.labels()}

    def held_by(self, pid: int, start: int) -> Holder:
        """These labels, held by that process (the slot record's holder)."""
        return dataclasses.replace(self, pid=pid, start=start)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Holder:
        """From a slot record, where pid and start are always there (KeyError/ValueError if not)."""
        return cls(int(d["pid"]), int(d["start"]), **{name: d.get(name) for name in LABELS})

    @classmethod
    def this_process(cls, **labels: str | None) -> Holder:
        pid = os.getpid()
        start = procs.start_ticks(pid)
        if start is None:
            raise CcsupError(f"unable to read the start time of this process ({pid}) from /proc")
        return cls(pid, start, **labels)
