"""When each piece of a turn's output arrived: `<state>/turns/<id>/<stream>.idx` beside its log.

The log keeps the exact bytes and nothing else; the index says when they came. It is a sequence
of 16-byte entries, `<Qd` (little-endian): the byte offset in the log where a read starts, and
the epoch time it was read. One entry per read of the pipe, appended with the log (one write of
16 bytes). `timed_chunks` pairs them back: each entry's bytes run to the next entry's offset
(the last to the end of the log).

State question. Written once, append-only, never rewritten. Stopped half-way (a crash): a
trailing partial entry (under 16 bytes) is ignored; entries past the log's end are clipped. No
index (a turn logged before indexes existed, or a lost file): the whole log is one chunk with no
time. Entries out of order (a corrupt file): they are skipped, never used to reorder bytes.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

ENTRY = struct.Struct("<Qd")


def entry(offset: int, at: float) -> bytes:
    return ENTRY.pack(offset, at)


def read_index(path: Path) -> list[tuple[int, float]]:
    """The index's (offset, time) entries, in order; [] when there is none."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    usable = len(raw) - len(raw) % ENTRY.size
    entries: list[tuple[int, float]] = []
    for offset, at in ENTRY.iter_unpack(raw[:usable]):
        if entries and offset < entries[-1][0]:
            continue  # out of order: corrupt; never reorder bytes
        entries.append((offset, at))
    return entries


def timed_chunks(
    log: Path, index: Path, block: int = 1 << 20
) -> Iterator[tuple[float | None, bytes]]:
    """The log's bytes as (time read, bytes) pieces, in order; time None where the index has none."""
    entries = read_index(index)
    with open(log, "rb") as f:
        size = f.seek(0, 2)
        f.seek(0)
        bounds: list[tuple[int, float | None]] = [(o, t) for o, t in entries if o < size]
        if not bounds or bounds[0][0] > 0:
            bounds.insert(0, (0, None))
        for n, (start, at) in enumerate(bounds):
            end = bounds[n + 1][0] if n + 1 < len(bounds) else size
            f.seek(start)
            left = end - start
            while left > 0:
                data = f.read(min(block, left))
                if not data:
                    return
                left -= len(data)
                yield at, data


def stamp(at: float | None) -> bytes:
    """The prefix `ccsup logs -t` puts before a line: local time to the millisecond."""
    if at is None:
        return b"-" * 23 + b" "
    whole = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))
    return f"{whole}.{int(at % 1 * 1000):03d} ".encode()


def timed_lines(chunks: Iterable[tuple[float | None, bytes]]) -> Iterator[bytes]:
    """The log's bytes with the time its line started arriving before each line (the bytes
    themselves unchanged; a last line without a newline is left open)."""
    at_line_start = True
    for at, data in chunks:
        pieces = data.split(b"\n")
        for n, piece in enumerate(pieces):
            last = n == len(pieces) - 1
            if at_line_start and (piece or not last):
                yield stamp(at)
                at_line_start = False
            yield piece if last else piece + b"\n"
            if not last:
                at_line_start = True


def offset_since(path: Path, since: float, end: int) -> int:
    """The log offset of the first read that arrived at or after `since` (epoch), by a binary
    search of the index (O(log n) reads: an index may hold millions of entries); `end` (the log's
    size) when none did, or 0 without a usable index (from the start: the safe side).

    What an adopting supervisor publishes from (supervisor.turns.adopt): the old one published
    what came before its death, give or take its lag, so it starts a margin before that."""
    try:
        with open(path, "rb") as f:
            count = os.fstat(f.fileno()).st_size // ENTRY.size
            if count == 0:
                return 0

            def at(i: int) -> tuple[int, float]:
                f.seek(i * ENTRY.size)
                offset, when = ENTRY.unpack(f.read(ENTRY.size))
                return offset, when

            lo, hi = 0, count
            while lo < hi:
                mid = (lo + hi) // 2
                if at(mid)[1] < since:
                    lo = mid + 1
                else:
                    hi = mid
            return end if lo == count else min(at(lo)[0], end)
    except OSError:
        return 0
