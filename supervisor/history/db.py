"""The history of turns, read: the SQLite file's form (schema, version, outcomes) and its queries.

Design note. The history is built from the supervisor's own bus events (`turn.<id>.queued`, ...
`released|cancelled|rejected`); supervisor.history.writer keeps them in one SQLite file, written
by the supervisor alone, that anyone may read. Rejected: writing from the manager at each
transition (the manager would learn SQL and block on fsync), and a JSON-lines file (a query by key
or time would read it all). SQLite is in the standard library, takes one writer with many readers
(WAL: `ccsup history` and the web page read while the supervisor writes), and answers the filters
with indexes.

What it knows: the file's name and schema (`SCHEMA`, `SCHEMA_VERSION`, shared with the writer so
one module says what a row is), the outcomes (`OUTCOMES`, `outcome_of`), and how to read a file
read-only (`query`, `show`): it opens it read-only and never creates it. What it does not know:
events, queues, threads or how rows are written (supervisor.history.writer), nor the event loop.

Outcome of a finished turn (`OUTCOMES`): ok (exit 0), exit (another code), signal (ended by a
signal it did not get from us), cancelled (cancelled while waiting, or stopped by a cancel, its
requester's end or a shutdown), timeout (stopped by a runtime limit, or its wait timed out),
rejected, guard_lost (the guard died without an outcome), oom (the kernel's OOM killer, when the
exited event says so), supervisor_restarted (the supervisor died while it ran), error (the guard
could not be started).

State question (reading; the writer's module answers for writing). Runs again: a read changes
nothing. Stops half-way: a reader holds a WAL snapshot and leaves nothing behind. Missing file:
HistoryError ("no history"). Corrupt file: HistoryError naming the file and SQLite's reason (the
writer moves it aside at its next start). A newer version (`PRAGMA user_version` > ours):
HistoryError saying so; never read. An older version (1: no argv, cwd) is read as it is, those
fields None; a version 2 file's adopted_at and adoption_gap_s read None (never adopted, as far as
it knows); the writer migrates either at its next start (`migrations`). Restart: nothing kept here.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypedDict

from ..errors import CcsupError

SCHEMA_VERSION = 4
# Columns each version added, for files of an older version (`migrations`): version 2, the
# turn's command (argv as a JSON list, and cwd), from its queued event; version 3, its adoption
# by a supervisor after the one that started it (from its `adopted` events); version 4, the
# whole tree's peak memory (bytes, from its exited event), what it left running when its command
# exited (JSON, from its leftovers event) and the pool member it ran on (from its granted event).
ADDED_COLUMNS = {
    2: (("argv", "TEXT"), ("cwd", "TEXT")),
    3: (("adopted_at", "REAL"), ("adoption_gap_s", "REAL")),
    4: (("peak_mem", "INTEGER"), ("leftovers", "TEXT"), ("member", "TEXT")),
}
FILE_NAME = "history.sqlite"
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
_CANCEL_REASONS = frozenset({"cancelled", "requester_gone", "shutdown"})

SCHEMA = """
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
    log_pruned_at REAL,       -- when its output logs were pruned, if they were
    argv TEXT,                -- JSON: the command, as asked (version 2)
    cwd TEXT,                 -- its working directory (version 2)
    adopted_at REAL,          -- when a later supervisor last adopted it (version 3)
    adoption_gap_s REAL,      -- seconds it ran with no supervisor, all its gaps (version 3)
    peak_mem INTEGER,         -- bytes: the whole tree's peak memory (version 4)
    leftovers TEXT,           -- JSON: {"count", "names": [...]}, what outlived its command (version 4)
    member TEXT               -- the pool member it ran on, when asked for a pool (version 4)
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
    argv: list[str] | None  # None in a turn recorded by a ccsup before version 2
    cwd: str | None
    # Adopted by a supervisor after the one that started it (turn.<id>.adopted): when it was
    # last adopted, and the seconds it ran without a supervisor in all (the sum of its gaps);
    # None when never adopted, or recorded by a ccsup before version 3.
    adopted_at: float | None
    adoption_gap_s: float | None
    # Version 4; None in a turn recorded before it, or where nothing was measured or left.
    peak_mem: int | None  # bytes, the whole tree's peak
    leftovers: dict[str, Any] | None  # {"count", "names"}: what outlived its command
    member: str | None  # the pool member it ran on


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


def migrations(version: int) -> list[str]:
    """The statements that bring a file of `version` (0: new, empty) up to SCHEMA_VERSION's
    columns; SCHEMA then makes what is missing. Adding columns only: an old row keeps its values
    and reads NULL in the new ones."""
    if version == 0:
        return []
    return [
        f"ALTER TABLE turns ADD COLUMN {name} {kind}"
        for v, columns in sorted(ADDED_COLUMNS.items())
        if v > version
        for name, kind in columns
    ]


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
    # An older file (read-only: never migrated by a reader) lacks the later columns: version 1
    # has no argv or cwd, version 2 no adopted_at or adoption_gap_s, version 3 no peak_mem,
    # leftovers or member.
    keys = row.keys()

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
        argv=json.loads(row["argv"]) if "argv" in keys and row["argv"] else None,
        cwd=row["cwd"] if "cwd" in keys else None,
        adopted_at=row["adopted_at"] if "adopted_at" in keys else None,
        adoption_gap_s=row["adoption_gap_s"] if "adoption_gap_s" in keys else None,
        peak_mem=row["peak_mem"] if "peak_mem" in keys else None,
        leftovers=json.loads(row["leftovers"])
        if "leftovers" in keys and row["leftovers"]
        else None,
        member=row["member"] if "member" in keys else None,
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


def ids_with_prefix(state_dir: Path, prefix: str, limit: int = 100) -> list[str]:
    """Turn ids that start with prefix, at most `limit` (a range on the primary key: ids are
    ASCII letters, digits, '_' and '-', all below DEL). HistoryError as `query`."""
    db = _connect_ro(state_dir)
    try:
        rows = db.execute(
            "SELECT id FROM turns WHERE id >= ? AND id < ? ORDER BY id LIMIT ?",
            (prefix, prefix + "\x7f", int(limit)),
        )
        return [row[0] for row in rows]
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


def recent_peaks(state_dir: Path, per_key: int = 20) -> dict[str, list[int]]:
    """Each key's last `per_key` whole-tree peaks (`peak_mem`, bytes), oldest first, for the
    memory prediction (supervisor.admission.room). {} when there is no history yet; HistoryError
    when it cannot be read (a file from before version 4 has no peaks: {})."""
    try:
        db = _connect_ro(state_dir)
    except HistoryError:
        if not history_path(state_dir).exists():
            return {}
        raise
    try:
        columns = {row[1] for row in db.execute("PRAGMA table_info(turns)")}
        if "peak_mem" not in columns:
            return {}
        rows = db.execute(
            "SELECT key, peak_mem FROM (SELECT key, peak_mem, exited_at, ROW_NUMBER() OVER "
            "(PARTITION BY key ORDER BY exited_at DESC) AS n FROM turns "
            "WHERE peak_mem IS NOT NULL AND peak_mem > 0) WHERE n <= ? ORDER BY exited_at",
            (per_key,),
        ).fetchall()
    except sqlite3.Error as e:
        raise HistoryError(f"unable to read history {history_path(state_dir)}: {e}") from None
    finally:
        db.close()
    peaks: dict[str, list[int]] = {}
    for key, peak in rows:
        peaks.setdefault(key, []).append(int(peak))
    return peaks


class LeftoverCount(TypedDict):
    """`history --leftovers`: one harness's leftovers of one name, summed across turns."""

    harness: str  # the turns' harness label, else their key's harness part (`opencode:xai` ->
    # `opencode`)
    name: str  # guardd.leftovers.name_of's: `opencode serve`; NOT_NAMED past a turn's first 100
    times: int  # processes left over
    turns: int  # turns that left at least one
    first: float  # when the first of those turns exited (epoch seconds)
    last: float


NOT_NAMED = "(not named: past the first 100 of a turn)"


def harness_of(key: str, holder: dict[str, Any]) -> str:
    harness = holder.get("harness")
    return harness if isinstance(harness, str) and harness else key.split(":", 1)[0]


def sum_leftovers(
    rows: Iterable[tuple[str, dict[str, Any], float | None, dict[str, Any]]],
) -> list[LeftoverCount]:
    """(key, holder, exited_at, leftovers) rows summed per harness and name, most often first.
    Pure; a malformed leftovers value counts what can be read of it."""
    sums: dict[tuple[str, str], LeftoverCount] = {}
    for key, holder, at, left in rows:
        harness = harness_of(key, holder)
        names = [n for n in left.get("names") or [] if isinstance(n, dict)]
        count = left.get("count")
        counted: dict[str, int] = {}
        for entry in names:
            name = entry.get("name") or entry.get("comm")
            name = name if isinstance(name, str) and name else "?"
            counted[name] = counted.get(name, 0) + 1
        if isinstance(count, int) and count > len(names):
            counted[NOT_NAMED] = count - len(names)
        when = at if isinstance(at, (int, float)) else 0.0
        for name, times in counted.items():
            was = sums.get((harness, name))
            if was is None:
                sums[(harness, name)] = LeftoverCount(
                    harness=harness, name=name, times=times, turns=1, first=when, last=when
                )
            else:
                was["times"] += times
                was["turns"] += 1
                was["first"] = min(was["first"], when)
                was["last"] = max(was["last"], when)
    return sorted(sums.values(), key=lambda c: (-c["times"], c["harness"], c["name"]))


def leftovers(
    state_dir: Path, *, key: str | None = None, since: float | None = None
) -> list[LeftoverCount]:
    """Every turn's leftovers (its `leftovers` column) summed per harness and name
    (`sum_leftovers`); key and since as `query` (since: by when the turn exited). HistoryError
    as `query`. Rows are read one at a time: a long history costs time, not memory."""
    sql = "SELECT key, holder, exited_at, leftovers FROM turns WHERE leftovers IS NOT NULL"
    params: list[object] = []
    if key is not None:
        sql += " AND key = ?"
        params.append(key)
    if since is not None:
        sql += " AND exited_at >= ?"
        params.append(since)
    db = _connect_ro(state_dir)
    try:
        if "leftovers" not in {row[1] for row in db.execute("PRAGMA table_info(turns)")}:
            return []  # a file from before version 4: nothing was named then
        return sum_leftovers(
            (key, _json_dict(holder), at, _json_dict(left))
            for key, holder, at, left in db.execute(sql, params)
        )
    except sqlite3.Error as e:
        raise HistoryError(f"unable to read history {history_path(state_dir)}: {e}") from None
    finally:
        db.close()


def _json_dict(text: str | None) -> dict[str, Any]:
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
