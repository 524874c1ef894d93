"""queue.json: what the supervisor acknowledged and has not finished, kept across restarts.

The file holds the waiting turns (with their env: it may hold API keys, so the file is 0600 and a
turn's env leaves it as soon as the turn is granted), the reservations, the turns that were running
(so a restarted supervisor can end their story with one terminal event), and the finished ids
with their terminal state (remembered ten minutes, so a retried request is answered, not rerun).

The state question:
- Runs again / restarts: `load` gives back what the last `save` wrote; the manager restores it.
- Stops half-way: `save` is an atomic replace (guardd.record.write_json): the old file or the new
  one, never a mix; a stray temporary file is ignored.
- Missing: nothing was waiting. Empty, corrupt, not an object, or a newer version: the file is
  moved aside to `queue.json.bad-<epoch>` (nothing is deleted), and `load` says why, so the daemon
  publishes an error event and logs the path; the supervisor starts with an empty queue.
Knows the file; nothing of turns' logic.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from guardd.record import RecordError, read_json, write_json

QUEUE_VERSION = 1


def save(path: Path, *, waiting: list[dict], reservations: list[dict], running: list[dict],
         finished: dict[str, list]) -> None:
    write_json(
        path,
        {
            "v": QUEUE_VERSION,
            "saved_at": time.time(),
            "waiting": waiting,
            "reservations": reservations,
            "running": running,
            "finished": finished,
        },
        mode=0o600,
    )


def load(path: Path) -> tuple[dict, str | None]:
    """(contents, problem). A bad file is moved aside and reported; contents are then empty."""
    empty = {"waiting": [], "reservations": [], "running": [], "finished": {}}
    try:
        data = read_json(path, max_version=QUEUE_VERSION)
        for name, kind in (("waiting", list), ("reservations", list), ("running", list), ("finished", dict)):
            if not isinstance(data.get(name, kind()), kind):
                raise RecordError(f"{path}: '{name}' is not a {kind.__name__}")
    except FileNotFoundError:
        return empty, None
    except RecordError as e:
        aside = path.with_name(f"{path.name}.bad-{int(time.time())}")
        try:
            os.replace(path, aside)
        except OSError as move_error:
            return empty, f"{e}; unable to move it aside: {move_error.strerror}"
        return empty, f"{e}; moved aside to {aside}"
    return {**empty, **{k: data[k] for k in empty if k in data}}, None
