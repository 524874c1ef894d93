"""Log retention: which turns' output logs to delete, oldest first, never a running turn's.

Design note. `<state>/turns/<id>/` holds a turn's `stdout.log`, `stderr.log` and their `.idx`
indexes. `[logs] keep` (an age) and `[logs] max_bytes` (all turns together) bound them: a turn
whose logs were last written more than `keep` ago is pruned, then the oldest turns are pruned
until the rest fit in `max_bytes`. A turn the supervisor is running (or that was written to in
the last `QUIET` seconds, so a turn that starts while a prune runs is safe too) is never pruned,
even when the running turns alone pass `max_bytes`. A pruned turn's directory keeps one small
file, `pruned.json` {"v":1, "pruned_at", "reason": "keep"|"max_bytes", "bytes"}, so `ccsup logs
ID` can say the logs were pruned rather than that the turn is unknown; the marker itself goes
once it is older than `keep` (or after a day without `keep`).

`prune` walks the directory (work that grows with the number of turns): the daemon runs it in a
thread (asyncio.to_thread), at start and every PRUNE_INTERVAL; it returns what it pruned so the
daemon can tell the history. The per-turn limit (`turn_max_bytes`) is applied as the output is
written (supervisor.guards.handle), not here.

State question. Runs again: a pruned turn is skipped (only its marker is left). Stops half-way
(a crash while deleting): the marker is written first, then the files are deleted, so a
restarted prune finds a marker beside leftovers and finishes the deletion. Unreadable entries
(permissions, a vanished directory) are skipped and logged, never fatal. Nothing else on disk.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from ..config.logs import LogLimits
from ..paths import TURN_ID

log = logging.getLogger("ccsup.retention")

PRUNE_INTERVAL = 300.0  # seconds between prunes while the supervisor runs
QUIET = 60.0  # a turn written to this recently is never pruned
MARKER = "pruned.json"
MARKER_LIFE_WITHOUT_KEEP = 86400.0


class Pruned(TypedDict):
    id: str
    reason: str  # "keep" or "max_bytes"
    bytes: int
    pruned_at: float


@dataclass
class _TurnLogs:
    id: str
    path: Path
    bytes: int
    last_write: float
    marker: dict | None


def _scan(turns_dir: Path) -> list[_TurnLogs]:
    found = []
    try:
        entries = list(os.scandir(turns_dir))
    except FileNotFoundError:
        return []
    except OSError as e:
        log.error("unable to list %s: %s", turns_dir, e.strerror)
        return []
    for entry in entries:
        if not TURN_ID.match(entry.name) or not entry.is_dir(follow_symlinks=False):
            continue
        size, last, marker = 0, 0.0, None
        try:
            for item in os.scandir(entry.path):
                st = item.stat(follow_symlinks=False)
                if item.name == MARKER:
                    marker = _read_marker(Path(item.path)) or {"pruned_at": st.st_mtime}
                    continue
                size += st.st_size
                last = max(last, st.st_mtime)
            if last == 0.0:
                last = entry.stat(follow_symlinks=False).st_mtime
        except OSError as e:
            log.warning("unable to read %s: %s", entry.path, e.strerror)
            continue
        found.append(_TurnLogs(entry.name, Path(entry.path), size, last, marker))
    return found


def _read_marker(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def marker_of(turn_dir: Path) -> dict | None:
    """The pruned marker of a turn's directory ({"pruned_at","reason","bytes"}), if pruned."""
    path = turn_dir / MARKER
    if not path.exists():
        return None
    return _read_marker(path) or {"pruned_at": None, "reason": "unknown", "bytes": None}


def _prune_one(turn: _TurnLogs, reason: str, now: float) -> Pruned | None:
    marker = {"v": 1, "pruned_at": now, "reason": reason, "bytes": turn.bytes}
    try:
        tmp = turn.path / f".{MARKER}.tmp"
        tmp.write_text(json.dumps(marker))
        os.replace(tmp, turn.path / MARKER)  # first: a crash from here on is finished next time
        for item in os.scandir(turn.path):
            if item.name != MARKER:
                os.unlink(item.path)
    except OSError as e:
        log.error("unable to prune the logs of turn %s in %s: %s", turn.id, turn.path, e.strerror)
        return None
    return Pruned(id=turn.id, reason=reason, bytes=turn.bytes, pruned_at=now)


def prune(
    turns_dir: Path, limits: LogLimits, running: set[str], now: float | None = None
) -> list[Pruned]:
    """Apply keep, then max_bytes (oldest first), to the logs under turns_dir; never to a turn in
    `running` or written to in the last QUIET seconds. Returns the turns pruned, oldest first."""
    now = time.time() if now is None else now
    turns = sorted(_scan(turns_dir), key=lambda t: t.last_write)
    pruned: list[Pruned] = []
    live: list[_TurnLogs] = []  # prunable by max_bytes, oldest first
    protected = 0  # bytes of running and recent turns: counted, never pruned
    for turn in turns:
        if turn.marker is not None:
            pruned_at = turn.marker.get("pruned_at")
            life = limits.keep if limits.keep is not None else MARKER_LIFE_WITHOUT_KEEP
            if turn.bytes and turn.id not in running:
                _prune_one(turn, str(turn.marker.get("reason", "unknown")), now)  # half-done
            elif isinstance(pruned_at, (int, float)) and now - pruned_at > life:
                shutil.rmtree(turn.path, ignore_errors=True)
            continue
        if turn.id in running or now - turn.last_write < QUIET:
            protected += turn.bytes
            continue
        if limits.keep is not None and now - turn.last_write > limits.keep:
            done = _prune_one(turn, "keep", now)
            if done is not None:
                pruned.append(done)
            continue
        live.append(turn)
    if limits.max_bytes is not None:
        total = protected + sum(t.bytes for t in live)
        for turn in live:  # oldest first
            if total <= limits.max_bytes:
                break
            done = _prune_one(turn, "max_bytes", now)
            if done is not None:
                pruned.append(done)
                total -= turn.bytes
    return pruned
