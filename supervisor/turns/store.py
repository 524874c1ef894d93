"""queue.json, queue.journal and finished.log: what the supervisor acknowledged, kept across restarts.

queue.json and its journal hold the waiting turns, the reservations, and the turns that were
running (so a restarted supervisor can end their story with one terminal event), each an entry
under its id (both files 0600). A waiting turn's env (it may hold API keys) is in neither: it is
in `secrets/<id>.json` (the directory 0700, the file 0600), and the entry says `"env_file": true`.

Design note. Rewriting queue.json whole at every change cost O(turns) per change (13 % of the
supervisor's time with 400 turns). Now each save appends one line per changed entry to
`queue.journal` (`{"put": "<section>", "item": {...}}` or `{"del": "<id>"}`, one write per save,
fsynced soon after by a thread, see supervisor.filework), and queue.json is the snapshot the journal starts from. When the journal holds
more than twice the live entries (and at least COMPACT_MIN lines), the state is compacted: queue.json is
written atomically with the next generation number `gen`, then the journal is replaced by one
holding only its header `{"v": 1, "gen": <that number>}`. O(1) per change, amortized.

The env of a waiting turn must not outlive the wait in any file. It was kept in the entry, so
each such turn's leaving compacted (rewrote queue.json whole): O(queue length) per leaving turn,
14.6 ms of CPU at 1,000 env-carrying waiters and 40 at 3,000 (tests/bench/bench_env_waiters.py).
Now it is written to its own file before the journal line that names it, and that file is
removed (by the file thread) once a line says the turn left the wait: one line and one unlink,
flat (0.5-1.2 ms at both sizes, as for waiters without env).

finished.log holds the finished ids with their terminal state (remembered ten minutes, so a retried
request is answered, not rerun): one line `<id> <state> <epoch> [<end>]` appended per ending
(`<end>`: a JSON object, how the turn ended, supervisor.turns.finished), so an ending
costs one small write however many ids are remembered (kept in queue.json, 20,000 ids made every
save 30 ms). It is compacted (rewritten atomically with the ids still remembered) at start and
when it has grown to more than twice what it should hold. An id in it wins over the same id in
queue.json's `running` list: a crash between the append and the save ends nothing twice.

The state question:
- Runs again / restarts: `load` gives back the snapshot with the journal replayed over it; the
  manager restores it and compacts.
- A full disk: an append is whole or not at all (`append_whole`: a short write is continued, and
  when the rest fails the file is cut back to its old size and the OSError raised); a snapshot
  that cannot be written leaves the old one and removes its temporary file. `QueueFile` then
  knows what it knew before, so the same change can be written later.
- Stops half-way: the snapshot is an atomic replace (old or new file); a crash between the new
  snapshot and the journal's replacement leaves a journal of the previous generation, which is
  not replayed (the snapshot already holds it). A crash inside an append leaves a torn last line:
  skipped, and said in the problems. A stray temporary file is ignored.
- Missing: nothing was waiting. A snapshot that is empty, corrupt, not an object, or a newer
  version is moved aside to `queue.json.bad-<epoch>` (nothing is deleted) and its journal with it
  (the journal means nothing without it); `load` says why, so the daemon publishes an error event
  and logs the path; the supervisor starts with an empty queue. A journal whose header is corrupt
  or newer, whose generation is ahead of the snapshot's, or with a bad line before its last, is
  moved aside to `queue.journal.bad-<epoch>` the same way (the lines before a bad one are kept).
- Env files: one whose line was never written (a crash in between), or whose turn left the wait
  before its removal ran, is a stray: removed at the writer's first compaction (at start). An
  entry whose env file is missing or unreadable (a power loss before its fsync, a person) cannot
  run as asked: it is not restored, and `load` says so, naming the file. An older build's
  queue.json with the env inline is read as before; the first compaction moves it to its file.
- finished.log: a line that cannot be parsed (a torn last line after a crash) is skipped and
  counted; a queue.json of an older build that still holds `finished` is read too.
- Planted or oversized: each file is read by guardd.record.read_file (no symlink followed, no
  FIFO opened blocking, at most QUEUE_LIMIT bytes); a file that fails it is corrupt (moved aside,
  finished.log too: FinishedIds.load), and a journal line that is JSON but no object is a bad
  line.
Knows the files; nothing of turns' logic.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

from guardd.record import RecordError, encode, read_file, read_json

from ..filework import FileWorker

QUEUE_VERSION = 1
QUEUE_LIMIT = 1 << 30  # bytes of queue.json, its journal or finished.log read at most
SECTIONS = ("waiting", "reservations", "running")
COMPACT_MIN = 256  # journal lines below which the journal is never compacted

Entry = tuple[str, dict[str, Any]]  # (section, item) of one id


def journal_path(queue: Path) -> Path:
    return queue.with_name("queue.journal")


def secrets_dir(queue: Path) -> Path:
    """Where waiting turns' env files are (0700; each `<id>.json`, 0600)."""
    return queue.with_name("secrets")


def _secret_env(entry: Entry | None) -> dict[str, Any] | None:
    """The env a waiting entry carries (kept in a file of its own), else None."""
    if entry is None or entry[0] != "waiting":
        return None
    env = entry[1].get("env")
    return env if isinstance(env, dict) and env else None


def _on_disk(entry: Entry) -> dict[str, Any]:
    """The item as queue.json and the journal hold it: a waiting turn's env only named."""
    section, item = entry
    if _secret_env(entry) is None:
        return item
    return {**{k: v for k, v in item.items() if k != "env"}, "env_file": True}


class QueueFile:
    """The writer of queue.json + queue.journal: knows what is on disk, appends what changed."""

    def __init__(self, path: Path, files: FileWorker | None = None):
        self.path = path
        self.files = FileWorker() if files is None else files  # fsyncs appends off the caller
        self.journal = journal_path(path)
        self.secrets = secrets_dir(path)
        self.entries: dict[str, Entry] = {}  # as the manager gave them: env included
        self.gen = 0
        self.lines = 0  # journal lines since the last compaction
        self.compactions = 0
        self._secret_ids: set[str] = set()  # ids whose env file this writer wrote

    def update(self, changes: dict[str, Entry | None]) -> None:
        """Persist these entries (None: the id is gone): one append for all of them, synced soon.

        A waiting turn's env goes to its own file first (`secrets/<id>.json`), never into the
        journal; it is removed once the journal says the turn left the wait. All or nothing: on
        OSError (a full disk) the files and what this object knows are as before, and the caller
        may try again."""
        lines: list[dict[str, Any]] = []
        applied: dict[str, Entry | None] = {}
        for item_id, new in changes.items():
            old = self.entries.get(item_id)
            if new == old:
                continue
            applied[item_id] = new
            if new is None:
                lines.append({"del": item_id})
            else:
                lines.append({"put": new[0], "item": _on_disk(new)})
        if not lines:
            return
        live = len(self.entries) + sum(
            (new is not None) - (item_id in self.entries) for item_id, new in applied.items()
        )
        if self.lines + len(lines) > max(COMPACT_MIN, 2 * live):
            before = {item_id: self.entries.get(item_id) for item_id in applied}
            self._apply(applied)
            try:
                self.compact()
            except OSError:
                self._apply(before)
                raise
            self._forget_secrets(before, applied)
            return
        written = self._write_secrets(applied)
        body = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines)
        try:
            fd = os.open(self.journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                size = os.fstat(fd).st_size
                if size == 0:  # a journal removed by hand: its header comes first
                    body = _header(self.gen) + body
                append_whole(fd, body.encode(), size, self.journal)
            finally:
                os.close(fd)
        except OSError:
            for item_id in written:  # no line names them: they must not stay behind
                self._remove_secret(item_id, now=True)
            raise
        before = {item_id: self.entries.get(item_id) for item_id in applied}
        self._apply(applied)
        self.lines += len(lines)
        self.files.sync_soon(self.journal)
        self._forget_secrets(before, applied)

    def _write_secrets(self, changes: dict[str, Entry | None]) -> list[str]:
        """The env file of each entry that now waits with an env it did not have on file."""
        written: list[str] = []
        try:
            for item_id, new in changes.items():
                env = _secret_env(new)
                if env is None:
                    continue
                old = self.entries.get(item_id)
                if item_id in self._secret_ids and _secret_env(old) == env:
                    continue
                self._write_secret(item_id, env)
                written.append(item_id)
        except OSError:
            for item_id in written:
                self._remove_secret(item_id, now=True)
            raise
        return written

    def _write_secret(self, item_id: str, env: dict[str, Any]) -> None:
        os.makedirs(self.secrets, mode=0o700, exist_ok=True)
        path = self.secrets / f"{item_id}.json"
        # Written in place, not renamed: its journal line comes after it, so a file torn by a
        # crash is named by no line (a stray, removed at the next start).
        body = encode({"v": QUEUE_VERSION, "id": item_id, "env": env})
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW
        fd = os.open(path, flags, 0o600)
        try:
            append_whole(fd, body, 0, path)
        finally:
            os.close(fd)
        self._secret_ids.add(item_id)
        self.files.sync_soon(path)

    def _remove_secret(self, item_id: str, *, now: bool = False) -> None:
        self._secret_ids.discard(item_id)
        path = self.secrets / f"{item_id}.json"
        if now:
            with contextlib.suppress(OSError):
                os.unlink(path)
        else:
            self.files.unlink_soon(path)  # the journal no longer names it: soon is enough

    def _forget_secrets(self, before: dict[str, Entry | None], after: dict[str, Entry | None]):
        """Env files of entries that left the wait (or the env) since `before`: removed soon."""
        for item_id, new in after.items():
            if _secret_env(before.get(item_id)) is not None and _secret_env(new) is None:
                self._remove_secret(item_id)

    def _apply(self, changes: dict[str, Entry | None]) -> None:
        for item_id, new in changes.items():
            if new is None:
                self.entries.pop(item_id, None)
            else:
                self.entries[item_id] = new

    def replace(self, entries: dict[str, Entry]) -> None:
        """Make the files hold exactly these entries (a compaction); as before on OSError."""
        before, self.entries = self.entries, dict(entries)
        try:
            self.compact()
        except OSError:
            self.entries = before
            raise

    def compact(self) -> None:
        if not self.compactions:  # the first in this process: above whatever is on disk
            self.gen = max(self.gen, _disk_gen(self.path, self.journal))
        gen = self.gen + 1
        sections: dict[str, list] = {name: [] for name in SECTIONS}
        missing: dict[str, Entry | None] = {}
        for item_id, (section, item) in self.entries.items():
            sections[section].append(_on_disk((section, item)))
            env = _secret_env((section, item))
            if env is not None and item_id not in self._secret_ids:
                missing[item_id] = (section, item)
        first = not self.compactions
        self._write_secrets(missing)  # (an older build's inline env, or a restored one's file)
        snapshot = {"v": QUEUE_VERSION, "gen": gen, "saved_at": time.time(), **sections}
        _write_atomic(self.path, encode(snapshot))
        self.gen = gen  # the snapshot is in place: the old journal is now stale, never replayed
        # A failure now leaves the old journal, of the previous generation: never replayed, and
        # the next compaction writes both again.
        _write_atomic(self.journal, _header(gen).encode())
        self.lines = 0
        self.compactions += 1
        if first:
            self._remove_stray_secrets()

    def _remove_stray_secrets(self) -> None:
        """Env files no entry names (a crash between one's writing and its journal line, or
        after the line that ended its wait): removed at this writer's first compaction."""
        try:
            names = os.listdir(self.secrets)
        except FileNotFoundError:
            return
        except OSError as e:
            raise OSError(e.errno, e.strerror, os.fspath(self.secrets)) from None
        for name in names:
            item_id = name[: -len(".json")] if name.endswith(".json") else None
            if item_id is None or _secret_env(self.entries.get(item_id)) is None:
                with contextlib.suppress(OSError):
                    os.unlink(self.secrets / name)


def append_whole(fd: int, data: bytes, size: int, path: str | os.PathLike[str]) -> None:
    """Append data at the end of fd (which is `size` long): whole, or not at all.

    A short write (a full disk takes what fits) is continued; when the rest fails, the file is
    cut back to `size`, so no torn line is left for a reader, and the OSError is raised."""
    done = 0
    try:
        while done < len(data):
            done += os.write(fd, data[done:])
    except OSError as e:
        if done:
            try:
                os.ftruncate(fd, size)
            except OSError as cut:
                raise OSError(e.errno, f"{e.strerror}; unable to cut {path} back", path) from cut
        if e.filename is None:
            raise OSError(e.errno, e.strerror, os.fspath(path)) from None
        raise


def _disk_gen(path: Path, journal: Path) -> int:
    """The highest generation queue.json or its journal names (0 when neither says)."""
    gens = [0]
    for file in (path, journal):
        try:
            raw = read_file(file, QUEUE_LIMIT)  # no FIFO, no symlink (guardd.record)
            first = raw.split(b"\n", 1)[0] if file == journal else raw
            gen = json.loads(first).get("gen")
        except (OSError, ValueError, AttributeError):  # RecordError is a ValueError
            continue
        if isinstance(gen, int) and not isinstance(gen, bool):
            gens.append(gen)
    return max(gens)


def _header(gen: int) -> str:
    return json.dumps({"v": QUEUE_VERSION, "gen": gen}, separators=(",", ":")) + "\n"


def _write_atomic(path: Path, data: bytes) -> None:
    """Temporary file, whole write, fsync, rename: the old file or the new one, never a part.
    On OSError the temporary file is removed (a full disk gets its room back)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            append_whole(fd, data, 0, path)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def append_finished(
    path: Path,
    item_id: str,
    state: str,
    at: float,
    sync: FileWorker | None = None,
    end: dict[str, Any] | None = None,
) -> None:
    """One line appended; fsynced here, or soon by sync's thread when given. `end`: how the item
    ended (a turn's exit and its time: FinishedIds), kept on the line as JSON."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        append_whole(fd, _finished_line(item_id, state, at, end), os.fstat(fd).st_size, path)
        if sync is None:
            os.fsync(fd)
    finally:
        os.close(fd)
    if sync is not None:
        sync.sync_soon(path)


def _finished_line(item_id: str, state: str, at: float, end: dict[str, Any] | None) -> bytes:
    tail = "" if not end else " " + json.dumps(end, separators=(",", ":"), ensure_ascii=True)
    return f"{item_id} {state} {at:.3f}{tail}\n".encode()


def rewrite_finished(
    path: Path,
    finished: dict[str, tuple[str, float]],
    ends: dict[str, dict[str, Any]] | None = None,
) -> None:
    ends = ends or {}
    body = b"".join(
        _finished_line(i, state, at, ends.get(i)) for i, (state, at) in finished.items()
    )
    _write_atomic(path, body)


def load_finished(
    path: Path, ends: dict[str, dict[str, Any]] | None = None
) -> tuple[dict[str, tuple[str, float]], int]:
    """(finished ids, how many lines were skipped as unreadable). A missing file is empty.
    `ends`, when given, is filled with the lines' ends (a line of an older build has none; a
    field it does not know is kept, and ignored by its readers)."""
    finished: dict[str, tuple[str, float]] = {}
    skipped = 0
    try:
        text = read_file(path, QUEUE_LIMIT).decode(errors="replace")
    except FileNotFoundError:
        return finished, 0
    for line in text.splitlines():
        parts = line.split(" ", 3)
        try:
            item_id, state, at = parts[:3]
            when = float(at)
            end = json.loads(parts[3]) if len(parts) == 4 else None
        except ValueError:  # a torn line (a crash inside its append) or garbage
            skipped += 1
            continue
        if end is not None and not isinstance(end, dict):
            skipped += 1
            continue
        finished[item_id] = (state, when)
        if ends is not None and end is not None:
            ends[item_id] = end
    return finished, skipped


def move_aside(path: Path, why: str) -> str:
    aside = path.with_name(f"{path.name}.bad-{int(time.time())}")
    try:
        os.replace(path, aside)
    except OSError as move_error:
        return f"{why}; unable to move it aside: {move_error.strerror}"
    return f"{why}; moved aside to {aside}"


def _read_snapshot(path: Path) -> dict:
    """queue.json checked (RecordError when unusable); FileNotFoundError passes through."""
    data = read_json(path, max_version=QUEUE_VERSION, limit=QUEUE_LIMIT)
    for name, kind in (
        ("waiting", list),
        ("reservations", list),
        ("running", list),
        ("finished", dict),
    ):
        if not isinstance(data.get(name, kind()), kind):
            raise RecordError(f"{path}: '{name}' is not a {kind.__name__}")
    gen = data.get("gen", 0)
    if not isinstance(gen, int) or isinstance(gen, bool):
        raise RecordError(f"{path}: 'gen' is not an integer")
    return data


def _replay(path: Path, gen: int, entries: dict[str, Entry]) -> str | None:
    """Apply the journal at path (generation gen) to entries; the problem found, if any.

    RecordError when the journal as a whole cannot be used (the caller moves it aside).
    """
    try:
        raw = read_file(path, QUEUE_LIMIT)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise RecordError(f"unable to read {path}: {e.strerror}") from None
    lines = raw.split(b"\n")
    torn = lines.pop() != b""  # no newline at the end: the last append was cut short
    if not lines and not torn:
        return None  # empty: nothing appended since a compaction that crashed before its header
    try:
        header = json.loads(lines[0]) if lines else None
    except ValueError:
        header = None
    if not isinstance(header, dict) or not isinstance(header.get("v"), int):
        raise RecordError(f"{path} has no valid header line")
    if header["v"] > QUEUE_VERSION:
        raise RecordError(
            f"{path} is version {header['v']}, newer than this ccsup knows ({QUEUE_VERSION})"
        )
    if header.get("gen") != gen:
        if isinstance(header.get("gen"), int) and header["gen"] < gen:
            return None  # folded into the snapshot already (a crash before the journal's reset)
        raise RecordError(f"{path} is generation {header.get('gen')!r}, not queue.json's {gen}")
    for number, line in enumerate(lines[1:], start=2):
        try:
            op = json.loads(line)
            if not isinstance(op, dict):  # valid JSON, but `[1, 2]` is no entry
                raise ValueError("not an object")
            if "del" in op:
                entries.pop(str(op["del"]), None)
            elif op.get("put") in SECTIONS and isinstance(op["item"]["id"], str):
                entries[op["item"]["id"]] = (op["put"], op["item"])
            else:
                raise ValueError("neither a put nor a del")
        except (ValueError, TypeError, KeyError) as e:
            raise RecordError(f"{path} line {number} is not a journal entry ({e})") from None
    return f"{path}: a torn last line was skipped" if torn else None


def read_queue(path: Path) -> dict:
    """What queue.json and its journal hold together, without moving anything (for tests and tools)."""
    data, _ = _load(path, move=False)
    if not data["finished"]:
        del data["finished"]  # only an older build wrote it
    return {"v": QUEUE_VERSION, **data}


def load(path: Path) -> tuple[dict, str | None]:
    """(contents, problem). A bad file is moved aside and reported; contents are then empty."""
    return _load(path, move=True)


def _load(path: Path, move: bool) -> tuple[dict, str | None]:
    empty: dict[str, Any] = {"waiting": [], "reservations": [], "running": [], "finished": {}}
    problems = []
    journal = journal_path(path)
    try:
        data = _read_snapshot(path)
    except FileNotFoundError:
        data = {"gen": 0}
    except RecordError as e:
        if not move:
            raise
        problems.append(move_aside(path, str(e)))
        if journal.exists():
            problems.append(move_aside(journal, f"{journal} belongs to it"))
        return empty, "; ".join(problems)
    entries: dict[str, Entry] = {}
    for section in SECTIONS:
        for item in data.get(section, []):
            item_id = item.get("id") if isinstance(item, dict) else None
            key = item_id if isinstance(item_id, str) else f"#{len(entries)}"
            entries[key] = (section, item)  # a malformed entry stays, for restore to report
    try:
        problem = _replay(journal, data["gen"] if "gen" in data else 0, entries)
        if problem:
            problems.append(problem)
    except RecordError as e:
        if not move:
            raise
        problems.append(move_aside(journal, str(e)))
    result = {**empty, "finished": data.get("finished", {})}
    secrets = secrets_dir(path)
    for section, item in entries.values():
        if isinstance(item, dict) and item.get("env_file") is True:
            problem = _take_env(secrets, item)
            if problem:
                problems.append(problem)
                continue
        result[section].append(item)
    return result, "; ".join(problems) or None


def _take_env(secrets: Path, item: dict[str, Any]) -> str | None:
    """Put the waiting turn's env back from its file; the problem (it is then not restored)."""
    item_id = item.get("id")
    path = secrets / f"{item_id}.json"
    try:
        data = read_json(path, max_version=QUEUE_VERSION)
        env = data.get("env")
        if data.get("id") != item_id or not isinstance(env, dict):
            raise RecordError(f"{path} is not the env of {item_id}")
    except (OSError, RecordError) as e:
        why = e.strerror if isinstance(e, OSError) else str(e)
        return f"unable to read the env of waiting turn {item_id} ({path}): {why}; not restored"
    del item["env_file"]
    item["env"] = env
    return None
