"""The history of turns: one SQLite file the supervisor writes and anyone may read.

Design note. The history is built from the supervisor's own bus events (`turn.<id>.queued`, ...
`released|cancelled|rejected`): the daemon hands every event it publishes to `Recorder.observe`,
which keeps the lifecycle ones (never output) and queues them for a writer thread. So the event
loop pays one dict check and a queue put per event; the SQLite work (one transaction per batch of
events) happens off it. Rejected: writing from the manager at each transition (the manager would
learn SQL and block on fsync), and a JSON-lines file (a query by key or time would read it all).
SQLite is in the standard library, takes one writer with many readers (WAL: `ccsup history` and
the web page read while the supervisor writes), and answers the filters with indexes.

One writer: the supervisor (the only process that holds the instance lock). Readers open the file
read-only and never create it. Usage figures come generically: every field of `turn.<id>.exited`
that is not the outcome (code, signal, reason) or the envelope is kept in `usage` (the containment
work adds wall_s, wait_s, cpu_user_s, cpu_system_s, peak_rss_bytes, processes).

Outcome of a finished turn (`OUTCOMES`): ok (exit 0), exit (another code), signal (ended by a
signal it did not get from us), cancelled (cancelled while waiting, or stopped by a cancel, its
requester's end or a shutdown), timeout (stopped by a runtime limit, or its wait timed out),
rejected, guard_lost (the guard died without an outcome), oom (the kernel's OOM killer, when the
exited event says so), supervisor_restarted (the supervisor died while it ran), error (the guard
could not be started).

State question. Runs again: rows are keyed by turn id and each event only fills columns, so an
event seen twice changes nothing. Stops half-way (SIGKILL): SQLite's transactions (WAL) keep the
file whole; events still queued are lost, and a turn whose terminal event was lost stays
`running` in the history until a restarted supervisor's restore publishes its end. Empty or
missing file: created with the schema. Corrupt file: moved aside to `history.sqlite.corrupt-<time>`
(logged) and started afresh. A newer version (`PRAGMA user_version` > ours): left untouched and
not written (logged); readers get a HistoryError saying so. Restart: the file is kept; old turns
are pruned with the logs (`prune`).
"""

from __future__ import annotations

import json
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypedDict

from .errors import CcsupError

log = logging.getLogger("ccsup.history")

SCHEMA_VERSION = 1
FILE_NAME = "history.sqlite"
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
    }
)
OUTCOMES = (
    "ok",
    "exit",
    "signal",
    "cancelled",
    "timeout",
    "rejected",
    "guard_lost",
    "oom",
    "supervisor_restarted",
    "error",
)
# Fields of an exited event that are not usage figures.
_EXIT_FIELDS = frozenset(
    {"v", "ts", "seq", "turn_seq", "id", "key", "code", "signal", "reason", "reservation"}
)
_CANCEL_REASONS = frozenset({"cancelled", "requester_gone", "shutdown"})

_SCHEMA = """
CREATE TABLE IF NOT EXISTS turns (
    id TEXT PRIMARY KEY,
    key TEXT NOT NULL,
    holder TEXT,              -- JSON: session, agent, harness, model, effort, mode, pid, start
    state TEXT NOT NULL,      -- the turn's last state: queued ... released | cancelled | rejected
    outcome TEXT,             -- OUTCOMES, once it has ended
    exit_code INTEGER,
    signal INTEGER,
    reason TEXT,              -- why it was stopped, cancelled or rejected, or why it has no code
    queued_at REAL,
    granted_at REAL,
    started_at REAL,
    exited_at REAL,
    ended_at REAL,            -- its terminal event
    slot_index INTEGER,
    guard_pid INTEGER,
    usage TEXT,               -- JSON: the exited event's usage figures, as they came
    log_pruned_at REAL        -- when its output logs were pruned, if they were
);
CREATE INDEX IF NOT EXISTS turns_key_ended ON turns(key, ended_at);
CREATE INDEX IF NOT EXISTS turns_ended ON turns(ended_at);
CREATE TABLE IF NOT EXISTS events (
    turn_id TEXT NOT NULL,
    turn_seq INTEGER,
    kind TEXT NOT NULL,
    ts REAL NOT NULL,
    body TEXT NOT NULL,       -- JSON, as published
    PRIMARY KEY (turn_id, kind, ts)
) WITHOUT ROWID;
"""


class HistoryError(CcsupError):
    """The history cannot be read (missing, corrupt, or written by a newer ccsup)."""


class TurnRecord(TypedDict):
    """One turn as the history knows it (`query` and `show`); times are epoch seconds."""

    id: str
    key: str
    holder: dict[str, Any]
    state: str
    outcome: str | None
    exit_code: int | None
    signal: int | None
    reason: str | None
    queued_at: float | None
    granted_at: float | None
    started_at: float | None
    exited_at: float | None
    ended_at: float | None
    wait_s: float | None  # granted - queued
    run_s: float | None  # exited - started
    slot_index: int | None
    guard_pid: int | None
    usage: dict[str, Any]  # the exited event's usage figures (empty until that work lands)
    log_pruned_at: float | None


class TurnEvent(TypedDict):
    kind: str
    ts: float
    turn_seq: int | None
    body: dict[str, Any]


class TurnStory(TurnRecord):
    """`show`: the record and every lifecycle event, in order."""

    events: list[TurnEvent]


def history_path(state_dir: Path) -> Path:
    return Path(state_dir) / FILE_NAME


def outcome_of(state: str, exit_info: dict | None, stop_reason: str | None) -> str:
    """The outcome of a finished turn from its terminal state, exited event and stopping reason."""
    if state == "rejected":
        return "rejected"
    if state == "cancelled":
        return "timeout" if stop_reason == "timeout" else "cancelled"
    if stop_reason == "timeout":
        return "timeout"
    if stop_reason in _CANCEL_REASONS:
        return "cancelled"
    info = exit_info or {}
    reason = info.get("reason")
    if info.get("oom") or reason == "oom":
        return "oom"
    if reason in ("guard_lost", "supervisor_restarted", "timeout"):
        return str(reason)
    if isinstance(info.get("signal"), int):
        return "signal"
    code = info.get("code")
    if isinstance(code, int):
        return "ok" if code == 0 else "exit"
    return "error"


# -- reading ---------------------------------------------------------------------------------------


def _connect_ro(state_dir: Path) -> sqlite3.Connection:
    path = history_path(state_dir)
    if not path.exists():
        raise HistoryError(f"no history in {state_dir}: no turn has run under this state directory")
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5.0)
        version = db.execute("PRAGMA user_version").fetchone()[0]
    except sqlite3.Error as e:
        raise HistoryError(f"unable to read history {path}: {e}") from None
    if version > SCHEMA_VERSION:
        db.close()
        raise HistoryError(
            f"unable to read history {path}: it is version {version}, written by a newer ccsup "
            f"(this one reads up to {SCHEMA_VERSION})"
        )
    db.row_factory = sqlite3.Row
    return db


def _record(row: sqlite3.Row) -> TurnRecord:
    def span(a: str, b: str) -> float | None:
        return None if row[a] is None or row[b] is None else max(0.0, row[b] - row[a])

    return TurnRecord(
        id=row["id"],
        key=row["key"],
        holder=json.loads(row["holder"] or "{}"),
        state=row["state"],
        outcome=row["outcome"],
        exit_code=row["exit_code"],
        signal=row["signal"],
        reason=row["reason"],
        queued_at=row["queued_at"],
        granted_at=row["granted_at"],
        started_at=row["started_at"],
        exited_at=row["exited_at"],
        ended_at=row["ended_at"],
        wait_s=span("queued_at", "granted_at"),
        run_s=span("started_at", "exited_at"),
        slot_index=row["slot_index"],
        guard_pid=row["guard_pid"],
        usage=json.loads(row["usage"] or "{}"),
        log_pruned_at=row["log_pruned_at"],
    )


def query(
    state_dir: Path,
    *,
    key: str | None = None,
    since: float | None = None,
    outcomes: Iterable[str] | None = None,
    finished: bool = True,
    limit: int = 1000,
) -> list[TurnRecord]:
    """Turns from the history of the supervisor on `state_dir`, newest first.

    key: one cap key; since: epoch seconds (turns that ended, or for finished=False were queued,
    at or after it); outcomes: any of OUTCOMES; finished=False includes turns still waiting or
    running; limit: at most this many. HistoryError when there is no history or it cannot be
    read. Reads a snapshot (WAL): safe while the supervisor writes.
    """
    where: list[str] = []
    params: list[object] = []
    if finished:
        where.append("ended_at IS NOT NULL")
    if key is not None:
        where.append("key = ?")
        params.append(key)
    # Finished turns are ordered (and filtered) by ended_at, which an index serves.
    when = "ended_at" if finished else "COALESCE(ended_at, queued_at)"
    if since is not None:
        where.append(f"{when} >= ?")
        params.append(since)
    if outcomes is not None:
        wanted = list(outcomes)
        unknown = sorted(set(wanted) - set(OUTCOMES))
        if unknown:
            raise HistoryError(f"unknown outcome {unknown[0]!r}; known: {', '.join(OUTCOMES)}")
        where.append(f"outcome IN ({','.join('?' * len(wanted))})")
        params.extend(wanted)
    sql = "SELECT * FROM turns"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += f" ORDER BY {when} DESC LIMIT ?"
    params.append(int(limit))
    db = _connect_ro(state_dir)
    try:
        return [_record(row) for row in db.execute(sql, params)]
    except sqlite3.Error as e:
        raise HistoryError(f"unable to read history {history_path(state_dir)}: {e}") from None
    finally:
        db.close()


def show(state_dir: Path, turn_id: str) -> TurnStory | None:
    """One turn's whole record with its lifecycle events in order, running or finished; None
    when the history does not know it."""
    db = _connect_ro(state_dir)
    try:
        row = db.execute("SELECT * FROM turns WHERE id = ?", (turn_id,)).fetchone()
        if row is None:
            return None
        events = [
            TurnEvent(
                kind=e["kind"], ts=e["ts"], turn_seq=e["turn_seq"], body=json.loads(e["body"])
            )
            for e in db.execute(
                "SELECT * FROM events WHERE turn_id = ? ORDER BY ts, turn_seq", (turn_id,)
            )
        ]
    except sqlite3.Error as e:
        raise HistoryError(f"unable to read history {history_path(state_dir)}: {e}") from None
    finally:
        db.close()
    return TurnStory(**_record(row), events=events)


# -- writing (the supervisor only) ------------------------------------------------------------------


def open_writer(path: Path) -> sqlite3.Connection | None:
    """The writer's connection, the schema made; a corrupt file is moved aside first. None when
    the file is a newer version (it is left alone and nothing is written)."""
    for attempt in (1, 2):
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
            db.executescript(_SCHEMA)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            return db
        except sqlite3.DatabaseError as e:
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
    db.execute(
        "INSERT OR IGNORE INTO turns (id, key, state, queued_at) VALUES (?, ?, ?, ?)",
        (turn_id, key, kind, ts if kind in ("queued", "rejected") else None),
    )
    sets: dict[str, Any] = {"state": kind}
    if kind == "queued":
        sets["holder"] = json.dumps(body.get("holder") or {}, separators=(",", ":"))
    elif kind == "granted":
        sets["granted_at"] = ts
        sets["slot_index"] = body.get("index")
    elif kind == "started":
        sets["started_at"] = ts
        sets["guard_pid"] = (body.get("guard") or {}).get("pid")
    elif kind == "stopping":
        sets["reason"] = body.get("reason")
    elif kind == "exited":
        sets["exited_at"] = ts
        sets["exit_code"] = body.get("code")
        sets["signal"] = body.get("signal")
        usage = {k: v for k, v in body.items() if k not in _EXIT_FIELDS}
        sets["usage"] = json.dumps(usage, separators=(",", ":"))
        if body.get("reason") is not None:
            sets["reason"] = body.get("reason")
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


class Recorder:
    """The supervisor's writer: `observe(topic, body)` on the event loop, SQLite in a thread.

    `observe` keeps only lifecycle events of turns (not reservations, not output) and costs a
    queue put. `close()` writes what is queued and stops the thread. `mark_pruned` and `prune`
    go through the same queue, so the thread is the file's only writer.
    """

    BATCH = 500
    GATHER = 0.05  # seconds

    def __init__(self, state_dir: Path):
        self.path = history_path(state_dir)
        self._queue: queue.SimpleQueue[tuple[str, Any] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.written = 0  # events written (for tests and metrics)
        self._idle = threading.Event()
        self._idle.set()

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

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything queued so far is written (tests; shutdown)."""
        return self._idle.wait(timeout)

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(10)
            self._thread = None

    def _run(self) -> None:
        try:
            db = open_writer(self.path)
        except CcsupError as e:
            log.error("%s: no history is written", e.message)
            db = None
        stop = False
        while not stop:
            items = [self._queue.get()]
            # Gather what comes in the next moment into the same transaction: fewer commits,
            # and fewer times this thread takes the GIL from the event loop.
            time.sleep(self.GATHER)
            while len(items) < self.BATCH:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if None in items:
                stop = True
                items = [i for i in items if i is not None]
            if db is not None and items:
                self._write(db, items)
            if self._queue.empty():
                self._idle.set()
        if db is not None:
            db.close()

    def _write(self, db: sqlite3.Connection, items: list) -> None:
        try:
            db.execute("BEGIN")
            for topic, value in items:
                if topic == "prune-logs":
                    ids, at = value
                    db.executemany(
                        "UPDATE turns SET log_pruned_at = ? WHERE id = ?", [(at, i) for i in ids]
                    )
                elif topic == "prune":
                    old = "SELECT id FROM turns WHERE ended_at IS NOT NULL AND ended_at < ?"
                    db.execute(f"DELETE FROM events WHERE turn_id IN ({old})", (value,))
                    db.execute(
                        "DELETE FROM turns WHERE ended_at IS NOT NULL AND ended_at < ?", (value,)
                    )
                else:
                    apply_event(db, topic, value)
                    self.written += 1
            db.execute("COMMIT")
        except sqlite3.Error as e:
            log.error("unable to write %d history event(s) to %s: %s", len(items), self.path, e)
            try:
                db.execute("ROLLBACK")
            except sqlite3.Error:
                pass
