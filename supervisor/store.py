"""queue.json and finished.log: what the supervisor acknowledged, kept across restarts.

queue.json holds the waiting turns (with their env: it may hold API keys, so the file is 0600 and a
turn's env leaves it as soon as the turn is granted), the reservations, and the turns that were
running (so a restarted supervisor can end their story with one terminal event). It is rewritten
whole at every change, so it holds only what is unfinished and stays small.

finished.log holds the finished ids with their terminal state (remembered ten minutes, so a retried
request is answered, not rerun): one line `<id> <state> <epoch>` appended per ending, so an ending
costs one small write however many ids are remembered (kept in queue.json, 20,000 ids made every
save 30 ms). It is compacted (rewritten atomically with the ids still remembered) at start and
when it has grown to more than twice what it should hold. An id in it wins over the same id in
queue.json's `running` list: a crash between the append and the save ends nothing twice.

The state question:
- Runs again / restarts: `load` gives back what the last `save` wrote; the manager restores it.
- Stops half-way: `save` is an atomic replace (guardd.record.write_json): the old file or the new
  one, never a mix; a stray temporary file is ignored.
- Missing: nothing was waiting. Empty, corrupt, not an object, or a newer version: the file is
  moved aside to `queue.json.bad-<epoch>` (nothing is deleted), and `load` says why, so the daemon
  publishes an error event and logs the path; the supervisor starts with an empty queue.
- finished.log: a line that cannot be parsed (a torn last line after a crash) is skipped and
  counted; a queue.json of an older build that still holds `finished` is read too.
Knows the file; nothing of turns' logic.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from guardd.record import RecordError, read_json, write_json

QUEUE_VERSION = 1


def save(path: Path, *, waiting: list[dict], reservations: list[dict], running: list[dict]) -> None:
    write_json(
        path,
        {
            "v": QUEUE_VERSION,
            "saved_at": time.time(),
            "waiting": waiting,
            "reservations": reservations,
            "running": running,
        },
        mode=0o600,
    )


def append_finished(path: Path, item_id: str, state: str, at: float) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, f"{item_id} {state} {at:.3f}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def rewrite_finished(path: Path, finished: dict[str, tuple[str, float]]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(
            fd, "".join(f"{i} {state} {at:.3f}\n" for i, (state, at) in finished.items()).encode()
        )
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def load_finished(path: Path) -> tuple[dict[str, tuple[str, float]], int]:
    """(finished ids, how many lines were skipped as unreadable). A missing file is empty."""
    finished: dict[str, tuple[str, float]] = {}
    skipped = 0
    try:
        text = path.read_bytes().decode(errors="replace")
    except FileNotFoundError:
        return finished, 0
    for line in text.splitlines():
        parts = line.split()
        try:
            item_id, state, at = parts
            finished[item_id] = (state, float(at))
        except ValueError:
            skipped += 1
    return finished, skipped


def load(path: Path) -> tuple[dict, str | None]:
    """(contents, problem). A bad file is moved aside and reported; contents are then empty."""
    empty = {"waiting": [], "reservations": [], "running": [], "finished": {}}
    try:
        data = read_json(path, max_version=QUEUE_VERSION)
        for name, kind in (
            ("waiting", list),
            ("reservations", list),
            ("running", list),
            ("finished", dict),
        ):
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
