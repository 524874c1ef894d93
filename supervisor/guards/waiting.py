"""The guards that wait for adoption, read from their records (blocking: call it off the loop).

A guard started with `--adopt-within` whose supervisor is gone keeps its turn running and says so
in its record (`<state>/guards/<pid>-<start>.json`): `waiting_since` (epoch seconds, not null),
`adopt_within` (seconds) and `state` "running". `ccsup status` counts them, from the supervisor
(its `status` answer, read in a thread) and, better for a user, when no supervisor runs at all:
then the turns run on only until their deadline, and `ccsup start` is what saves them.

Design note. Every record is read with guardd.record.read_file/read_json (no symlink followed,
no FIFO opened, at most RECORD_LIMIT bytes). A record without `waiting_since`, or with it null,
is skipped unparsed (most records, on a machine where nothing waits), and a running supervisor
skips its own guards' records unread (`skip`: it watches them, so none waits); measured on 500
records: 6 ms a survey, 22 ms when all 500 wait. A record whose guard is not alive with the
start it names (guardd.procs.identity_of: the pid reused, or the guard gone without rewriting its
record) is not counted, nor one whose deadline has passed (the guard ends the work then).
Rejected: asking each guard over its channel (a channel is there for the adopter, and the record
says what is needed).

Knows guard records (guardd.record) and process identity (guardd.procs); nothing of slots, the
bus or the supervisor. State: none; it only reads, so running it twice, or abandoning it half-way,
is harmless.
"""

from __future__ import annotations

import os
import time
from collections.abc import Set
from dataclasses import dataclass

from guardd import procs
from guardd.record import RecordError, read_file, read_json

# A record without the key (a guard without --adopt-within), or with it null as
# guardd.record.encode writes it (not waiting), is skipped unparsed.
_WAITING_KEY = b'"waiting_since"'
_NOT_WAITING = b'"waiting_since":null'


@dataclass(frozen=True)
class Waiting:
    """The guards that wait for adoption: how many, and the deadline of the last (epoch)."""

    count: int
    last_until: float | None

    def to_json(self) -> dict[str, object]:
        """The `status` answer's fields."""
        return {"waiting_adoption": self.count, "waiting_adoption_until": self.last_until}


def deadline_of(record: dict) -> float | None:
    """When a waiting guard's record says it ends the work unless adopted (waiting_since +
    adopt_within); None when the record does not say it waits."""
    since, within = record.get("waiting_since"), record.get("adopt_within")
    if record.get("state") != "running":
        return None
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (since, within)):
        return None
    return float(since) + float(within)  # type: ignore[arg-type]


def _guard_alive(record: dict) -> bool:
    guard = record.get("guard")
    try:
        ident = procs.Identity.from_json(guard)  # type: ignore[arg-type]
    except (TypeError, KeyError, ValueError):
        return False
    return procs.identity_of(ident.pid) == ident


def survey(
    guards_dir: str | os.PathLike[str], now: float | None = None, skip: Set[str] = frozenset()
) -> Waiting:
    """The guards of this record directory that wait for adoption now. `skip`: names of records
    not to read (a running supervisor's own guards: watched by it, so none of them waits)."""
    now = time.time() if now is None else now
    count, last = 0, None
    try:
        names = [
            e.name
            for e in os.scandir(guards_dir)
            if e.name.endswith(".json") and e.name not in skip
        ]
    except OSError:  # no guards directory: nothing ever ran here
        return Waiting(0, None)
    for name in names:
        path = os.path.join(guards_dir, name)
        try:
            raw = read_file(path)
            if _WAITING_KEY not in raw or _NOT_WAITING in raw:
                continue
            record = read_json(path)  # read again, checked whole: a rare record, the waiting one
        except (OSError, RecordError):
            continue  # gone meanwhile, or unreadable: the reaper counts those
        until = deadline_of(record)
        if until is None or until <= now or not _guard_alive(record):
            continue
        count += 1
        last = until if last is None else max(last, until)
    return Waiting(count, last)
