"""The history of turns, written: the supervisor's Recorder, one writer thread for the SQLite file.

Design note. The daemon hands every event it publishes to `Recorder.observe`, which keeps the
lifecycle ones (never output) and queues them for a writer thread. So the event loop pays one dict
check and a queue put per event; the SQLite work (one transaction per batch of events) happens off
it. One writer: the supervisor (the only process that holds the instance lock). Usage figures
come generically: every field of `turn.<id>.exited` that is not the outcome (code, signal, reason)
or the envelope is kept in `usage` (the containment work adds wall_s, wait_s, cpu_user_s,
cpu_system_s, peak_rss_bytes, processes).

What it knows: which events are kept (`LIFECYCLE`), how an event changes a row (`apply_event`),
opening the file for writing (`open_writer`: schema made, a corrupt file moved aside), the writer
thread and its queue, pruning. What it does not know: the file's form and outcomes (taken from
supervisor.history.db, which also does every read), the bus, the manager.

State question. Runs again: rows are keyed by turn id and each event only fills columns, so an
event seen twice changes nothing. Stops half-way (SIGKILL): SQLite's transactions (WAL) keep the
file whole; events still queued are lost: a turn whose end was lost gets it from the next
supervisor, from finished.log's line (`repair`, dated as it happened) or, when it had not
finished, from restore's settling of it. Empty or
missing file: created with the schema. An older version (1 to 3): the columns it lacks are added
in one transaction (db.migrations) before anything is written; old rows read NULL there (version
2's turns: never adopted). Corrupt file (SQLite says corrupt, or not a database): moved aside to
`history.sqlite.corrupt-<time>` (logged) and started afresh. Any other failure to open or write it
(the disk full, an I/O error): the file is left where it is, said once in the log, and the events
are kept in memory (up to PENDING_MAX, the oldest dropped beyond, counted) and written when a try
every RETRY seconds succeeds (`Unavailable`): turns that ended meanwhile reach it then. A newer version (`PRAGMA user_version` > ours): left untouched and
not written (logged). Restart: the file is kept; old turns are pruned with the logs (`prune`).
Modes: the file is made 0600 before SQLite opens it (SQLite makes it 0644, and its -wal and -shm
copy the file's mode); one left wider by an older ccsup is narrowed at open (`_make_private`).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import queue
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from ..errors import CcsupError
from .db import SCHEMA, SCHEMA_VERSION, history_path, migrations, outcome_of

log = logging.getLogger("ccsup.history")

LIFECYCLE = frozenset(
    {
        "queued",
        "granted",
        "started",
        "exited",
        "stopping",
        "gone",
        "released",
        "cancelled",
        "rejected",
        "truncated",  # the turn's logs reached [logs] turn_max_bytes (kept as an event only)
        "adopted",  # a later supervisor took the running turn over (adopted_at, adoption_gap_s)
        "leftovers",  # what still ran when its command exited (kept in `leftovers`)
    }
)
# States a turn has left once it runs: an adopted turn whose started event was lost with its
# first supervisor (events still queued die with it) is still known to have started.
_BEFORE_STARTED = ("queued", "granted")
# Fields of an exited event that are not usage figures.
_EXIT_FIELDS = frozenset(
    {"v", "ts", "epoch", "seq", "turn_seq", "id", "key", "code", "signal", "reason", "error"}
    | {"reservation", "exited_at", "repaired"}
)


class Unavailable(Exception):
    """The history cannot be opened or written now, its file not corrupt (the disk full, an I/O
    error): left in place, tried again later."""


_CORRUPT = {getattr(sqlite3, "SQLITE_CORRUPT", 11), getattr(sqlite3, "SQLITE_NOTADB", 26)}


def corrupt(e: sqlite3.Error) -> bool:
    """Does SQLite say the file itself is bad (corrupt, not a database)? A full disk, an I/O error
    or a lock is not the file's fault."""
    code = getattr(e, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in _CORRUPT
    text = str(e)
    return "malformed" in text or "not a database" in text


_FOR_NOW = {
    getattr(sqlite3, name, code)
    for name, code in (
        ("SQLITE_FULL", 13),
        ("SQLITE_IOERR", 10),
        ("SQLITE_CANTOPEN", 14),
        ("SQLITE_BUSY", 5),
        ("SQLITE_LOCKED", 6),
    )
}


def _for_now(e: sqlite3.Error) -> bool:
    """A failure that passes (the disk full, an I/O error, a lock), not one of the events'."""
    code = getattr(e, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in _FOR_NOW
    return "disk is full" in str(e) or "disk I/O error" in str(e)


def _disk_full(directory: Path) -> bool:
    """Is the filesystem under directory out of room (SQLite may say only "disk I/O error")?"""
    try:
        st = os.statvfs(directory)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < 64 * 1024 or (st.f_files > 0 and st.f_favail == 0)


def open_writer(path: Path) -> sqlite3.Connection | None:
    """The writer's connection, the schema made; a corrupt file is moved aside first. None when
    the file is a newer version (it is left alone and nothing is written). Unavailable when it
    cannot be opened now for another reason (the disk full): the file is left as it is."""
    for attempt in (1, 2):
        _make_private(path)
        db: sqlite3.Connection | None = None
        try:
            db = sqlite3.connect(path, timeout=5.0, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")  # WAL: a crash loses at most the last batch
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                log.error(
                    "history %s is version %d, written by a newer ccsup: it is left as it is and "
                    "no history is written",
                    path,
                    version,
                )
                db.close()
                return None
            if version < SCHEMA_VERSION and _has_turns(db):
                with db:  # one transaction: a stop half-way leaves the old version, whole
                    db.execute("BEGIN")
                    for statement in migrations(version or 1):
                        db.execute(statement)
                    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            db.executescript(SCHEMA)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            return db
        except sqlite3.Error as e:
            if db is not None:
                db.close()
            if not corrupt(e):
                raise Unavailable(f"unable to open history {path}: {e}") from None
            if attempt == 2:
                raise CcsupError(f"unable to open history {path}: {e}") from None
            aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
            log.error("history %s is unreadable (%s): moved to %s, starting afresh", path, e, aside)
            for suffix in ("", "-wal", "-shm"):
                try:
                    Path(f"{path}{suffix}").rename(f"{aside}{suffix}")
                except FileNotFoundError:
                    pass
    return None


def _has_turns(db: sqlite3.Connection) -> bool:
    """Is there a turns table (an older file to migrate), as opposed to a new, empty file?"""
    row = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'turns'")
    return row.fetchone() is not None


def _make_private(path: Path) -> None:
    """The history file, and its -wal and -shm where they exist, 0600 (the file made if missing):
    the turns' lifecycle is the owner's alone, as every state file is."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EIO):
            raise Unavailable(f"unable to open history {path}: {e.strerror}") from None
        raise CcsupError(f"unable to open history {path}: {e.strerror}") from None
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    for suffix in ("-wal", "-shm"):
        try:
            os.chmod(f"{path}{suffix}", 0o600, follow_symlinks=False)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise CcsupError(
                f"unable to make history {path}{suffix} private: {e.strerror}"
            ) from None


def apply_event(db: sqlite3.Connection, topic: str, body: dict) -> None:
    """Apply one lifecycle event (inside the caller's transaction)."""
    turn_id, _, kind = topic[5:].rpartition(".")
    ts = float(body.get("ts") or time.time())
    key = body.get("key") or ""
    db.execute(
        "INSERT OR IGNORE INTO events VALUES (?, ?, ?, ?, ?)",
        (turn_id, body.get("turn_seq"), kind, ts, json.dumps(body, separators=(",", ":"))),
    )
    if kind == "truncated":
        return  # an event of the turn's story, not a change of its state
    if kind == "leftovers":  # part of the turn's story too: its state stays
        left = {"count": body.get("count"), "names": body.get("names")}
        db.execute(
            "UPDATE turns SET leftovers = ? WHERE id = ?",
            (json.dumps(left, separators=(",", ":")), turn_id),
        )
        return
    if kind == "adopted":
        _apply_adopted(db, turn_id, key, body)
        return
    db.execute(
        "INSERT OR IGNORE INTO turns (id, key, state, queued_at) VALUES (?, ?, ?, ?)",
        (turn_id, key, kind, ts if kind in ("queued", "rejected") else None),
    )
    sets: dict[str, Any] = {"state": kind}
    if kind == "queued":
        sets["holder"] = json.dumps(body.get("holder") or {}, separators=(",", ":"))
        if body.get("argv") is not None:  # a turn's (a reservation has none)
            # ASCII escapes: an argument that is not UTF-8 arrives as lone surrogates, which
            # SQLite refuses to store as text (the whole turn was then missing from history).
            sets["argv"] = json.dumps(body["argv"], separators=(",", ":"))
            sets["cwd"] = body.get("cwd")
    elif kind == "granted":
        sets["granted_at"] = ts
        sets["slot_index"] = body.get("index")
        if body.get("member") is not None:  # a pool's turn: the member it was granted on
            sets["member"] = body.get("member")
    elif kind == "started":
        sets["started_at"] = ts
        sets["guard_pid"] = (body.get("guard") or {}).get("pid")
    elif kind == "stopping":
        sets["reason"] = body.get("reason")
    elif kind == "exited":
        # when CMD ended, by its guard's record (a turn that ended in a supervisor's absence is
        # settled later: the event's own time is the settling's)
        at = body.get("exited_at")
        sets["exited_at"] = at if isinstance(at, int | float) and not isinstance(at, bool) else ts
        sets["exit_code"] = body.get("code")
        sets["signal"] = body.get("signal")
        usage = {k: v for k, v in body.items() if k not in _EXIT_FIELDS}
        sets["usage"] = json.dumps(usage, separators=(",", ":"))
        if isinstance(body.get("peak_mem"), int):  # the whole tree's peak, bytes
            sets["peak_mem"] = body["peak_mem"]
        if body.get("reason") is not None:
            sets["reason"] = body.get("reason")
        if isinstance(body.get("error"), str):  # CMD did not start: "not_found: <the line>"
            sets["reason"] = f"{body.get('reason')}: {body['error']}"
    elif kind in ("released", "cancelled", "rejected"):
        sets["ended_at"] = ts
        row = db.execute(
            "SELECT exit_code, signal, reason, usage, exited_at FROM turns WHERE id = ?",
            (turn_id,),
        ).fetchone()
        stopped = db.execute(
            "SELECT body FROM events WHERE turn_id = ? AND kind = 'stopping'", (turn_id,)
        ).fetchone()
        stop_reason = json.loads(stopped[0]).get("reason") if stopped else None
        exit_info = None
        if row is not None and row[4] is not None:
            exit_info = {"code": row[0], "signal": row[1], "reason": row[2]}
            exit_info.update(json.loads(row[3] or "{}"))
        if kind != "released":
            sets["reason"] = body.get("reason")
            stop_reason = stop_reason or body.get("reason")
        sets["outcome"] = outcome_of(kind, exit_info, stop_reason)
    columns = ", ".join(f"{name} = ?" for name in sets)
    db.execute(f"UPDATE turns SET {columns} WHERE id = ?", [*sets.values(), turn_id])


def _apply_adopted(db: sqlite3.Connection, turn_id: str, key: str, body: dict) -> None:
    """`turn.<id>.adopted`: the turn runs on under a new supervisor. Its adoption columns are
    made from all its adopted events (kept in `events` once each), so an event seen twice, or a
    turn adopted twice, comes out the same: adopted_at the last adoption, adoption_gap_s the
    sum of the gaps. Its state is not changed (it still runs); a turn the history lost the
    start of (see the module's state question) is marked started, with its slot, guard and
    start time (the event's `started_at`, when it has one)."""
    guard = body.get("guard")
    guard_pid = guard.get("pid") if isinstance(guard, dict) else None
    started = body.get("started_at")  # the guard's start, for a turn whose started was lost
    if not isinstance(started, (int, float)) or isinstance(started, bool):
        started = None
    db.execute(
        "INSERT OR IGNORE INTO turns (id, key, state) VALUES (?, ?, 'started')", (turn_id, key)
    )
    adopted_at, gaps = 0.0, 0.0
    for ts, raw in db.execute(
        "SELECT ts, body FROM events WHERE turn_id = ? AND kind = 'adopted'", (turn_id,)
    ):
        adopted_at = max(adopted_at, ts)
        gap = json.loads(raw).get("gap_s")
        if isinstance(gap, (int, float)) and not isinstance(gap, bool) and gap >= 0:
            gaps += gap
    db.execute(
        "UPDATE turns SET adopted_at = ?, adoption_gap_s = ?,"
        f" state = CASE WHEN state IN {_BEFORE_STARTED!r} THEN 'started' ELSE state END,"
        " slot_index = COALESCE(slot_index, ?), guard_pid = COALESCE(guard_pid, ?),"
        " started_at = COALESCE(started_at, ?)"
        " WHERE id = ?",
        (adopted_at, gaps, body.get("index"), guard_pid, started, turn_id),
    )


_TERMINAL = ("released", "cancelled", "rejected")


def repair_ends(db: sqlite3.Connection, ends: dict[str, dict[str, Any]]) -> int:
    """The ends finished.log holds and the history lacks (a SIGKILL within the writer's batch):
    for a turn whose row is missing or not terminal, its `stopping` (a stop's reason), `exited`
    and terminal event, dated as they happened and marked `"repaired": true`. A turn whose
    history is whole is left as it is, so this runs again harmlessly. Returns the events written."""
    written = 0
    for turn_id, end in ends.items():
        state, key = end.get("state"), end.get("key")
        if state not in _TERMINAL or not isinstance(key, str):
            continue
        row = db.execute("SELECT state, exited_at FROM turns WHERE id = ?", (turn_id,)).fetchone()
        if row is not None and row[0] in _TERMINAL:
            continue
        ended_at = _epoch(end.get("ended_at")) or time.time()
        base = {"id": turn_id, "key": key, "repaired": True}
        stop_reason = end.get("stop_reason")
        exit_info = end.get("exit")
        exited_at = _epoch(end.get("exited_at")) or ended_at
        if isinstance(stop_reason, str) and state == "released":
            stopped = db.execute(
                "SELECT 1 FROM events WHERE turn_id = ? AND kind = 'stopping'", (turn_id,)
            ).fetchone()
            if stopped is None:
                body = {**base, "ts": min(exited_at, ended_at), "reason": stop_reason}
                apply_event(db, f"turn.{turn_id}.stopping", body)
                written += 1
        if isinstance(exit_info, dict) and (row is None or row[1] is None):
            body = {
                **base,
                "ts": exited_at,
                "code": exit_info.get("code"),
                "signal": exit_info.get("signal"),
                "reason": exit_info.get("reason"),
                "exited_at": exited_at,
            }
            apply_event(db, f"turn.{turn_id}.exited", body)
            written += 1
        terminal = {**base, "ts": ended_at}
        if state != "released":
            terminal["reason"] = end.get("reason")
        apply_event(db, f"turn.{turn_id}.{state}", terminal)
        written += 1
    return written


def _epoch(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


class Recorder:
    """The supervisor's writer: `observe(topic, body)` on the event loop, SQLite in a thread.

    `observe` keeps only lifecycle events of turns (not reservations, not output) and costs a
    queue put. `close()` writes what is queued and stops the thread. `mark_pruned` and `prune`
    go through the same queue, so the thread is the file's only writer.
    """

    BATCH = 500
    GATHER = 0.05  # seconds
    RETRY = 1.0  # seconds between tries of a history that could not be opened or written
    PENDING_MAX = 100_000  # events kept while it cannot be written; the oldest go beyond

    def __init__(self, state_dir: Path):
        self.path = history_path(state_dir)
        self._queue: queue.SimpleQueue[tuple[str, Any] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.written = 0  # events written (for tests and metrics)
        self._idle = threading.Event()
        self._idle.set()
        self._closing = threading.Event()  # set by close(): what is queued is written at once
        self._unavailable: str | None = None  # why the file cannot be written now (said once)
        self._retry_at = 0.0
        self.dropped = 0  # events dropped past PENDING_MAX while it could not be written

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="history", daemon=True)
        self._thread.start()

    def observe(self, topic: str, body: dict) -> None:
        if not topic.startswith("turn."):
            return
        kind = topic[topic.rfind(".") + 1 :]
        if kind not in LIFECYCLE or body.get("reservation") is True:
            return
        self._idle.clear()
        self._queue.put((topic, body))

    def mark_pruned(self, turn_ids: list[str], at: float) -> None:
        self._idle.clear()
        self._queue.put(("prune-logs", (turn_ids, at)))

    def prune(self, before: float) -> None:
        """Forget turns that ended before `before` (epoch seconds)."""
        self._idle.clear()
        self._queue.put(("prune", before))

    def repair(self, ends: dict[str, dict[str, Any]]) -> None:
        """Write the ends the history lacks (supervisor.turns.finished.FinishedIds.ends): each
        turn whose row is not terminal gets its `exited` and terminal event from its end."""
        if ends:
            self._idle.clear()
            self._queue.put(("repair", ends))

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything queued so far is written (tests; shutdown)."""
        return self._idle.wait(timeout)

    def close(self) -> None:
        if self._thread is not None:
            self._closing.set()
            self._queue.put(None)
            self._thread.join(10)
            self._thread = None

    def _run(self) -> None:
        db = self._open()
        pending: list = []  # not written yet: the file could not be opened or written
        stop = False
        while not stop:
            try:
                items = [self._queue.get(timeout=self.RETRY if pending else None)]
            except queue.Empty:
                items = []
            # Gather what comes in the next moment into the same transaction: fewer commits,
            # and fewer times this thread takes the GIL from the event loop. Not once closing:
            # the supervisor's stop waits for this thread.
            if items:
                self._closing.wait(self.GATHER)
            while len(items) < self.BATCH:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if None in items:
                stop = True
                items = [i for i in items if i is not None]
            if self._unavailable is not None and time.monotonic() >= self._retry_at:
                db = self._open()
            pending.extend(items)
            if db is not None and pending:
                if self._write(db, pending):
                    pending = []
                else:
                    db.close()
                    db = None
            if len(pending) > self.PENDING_MAX:
                self.dropped += len(pending) - self.PENDING_MAX
                del pending[: len(pending) - self.PENDING_MAX]
            if self._queue.empty():
                self._idle.set()
        if db is not None:
            db.close()

    def _open(self) -> sqlite3.Connection | None:
        """open_writer, a failure said once per spell (and when it ends), and tried again."""
        try:
            db = open_writer(self.path)
        except Unavailable as e:
            self._unavailable_now(str(e))
            return None
        except CcsupError as e:
            log.error("%s: no history is written", e.message)
            return None
        if self._unavailable is not None:
            log.warning(
                "history %s is written again (%d events were dropped)", self.path, self.dropped
            )
            self._unavailable = None
        return db

    def _unavailable_now(self, why: str) -> None:
        if self._unavailable is None:
            log.error(
                "%s%s: the file is left as it is; events are kept and written once it can be "
                "(tried every %gs)",
                why,
                " (the disk is full)" if _disk_full(self.path.parent) else "",
                self.RETRY,
            )
        self._unavailable = why
        self._retry_at = time.monotonic() + self.RETRY

    def _write(self, db: sqlite3.Connection, items: list) -> bool:
        """One transaction of items: True when written (or dropped for good), False when the file
        cannot be written now (the disk full, an I/O error): rolled back, to be tried again."""
        written = 0
        try:
            db.execute("BEGIN")
            for topic, value in items:
                if topic == "prune-logs":
                    ids, at = value
                    db.executemany(
                        "UPDATE turns SET log_pruned_at = ? WHERE id = ?", [(at, i) for i in ids]
                    )
                elif topic == "repair":
                    written += repair_ends(db, value)
                elif topic == "prune":
                    old = "SELECT id FROM turns WHERE ended_at IS NOT NULL AND ended_at < ?"
                    db.execute(f"DELETE FROM events WHERE turn_id IN ({old})", (value,))
                    db.execute(
                        "DELETE FROM turns WHERE ended_at IS NOT NULL AND ended_at < ?", (value,)
                    )
                else:
                    apply_event(db, topic, value)
                    written += 1
            db.execute("COMMIT")
        except sqlite3.Error as e:
            try:
                db.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            if _for_now(e):
                self._unavailable_now(f"unable to write history {self.path}: {e}")
                return False
            log.error("unable to write %d history event(s) to %s: %s", len(items), self.path, e)
            return True
        self.written += written
        return True
