"""A turn's logs as timed lines, for `ccsup logs` when it merges streams, stamps or tails. Pure
but for reading the two files (a log and its time index, supervisor.output.line_times).

`LineReader` reads one stream's log from where it stopped, and its index likewise, and hands back
each complete line with the time its first byte arrived (None where the index has no entry);
`rest()` gives a last line without its newline. It keeps its place, so following a growing log is
calling `lines()` again. `merge` orders several readers' lines by time (ties keep stream order:
stdout before stderr), which is the order they were read from the pipes, not the exact order the
command wrote them: two pipes carry no order between them. Lines are cut at MAX_LINE bytes so a
log without newlines cannot fill memory.
"""

from __future__ import annotations

import bisect
from pathlib import Path

from ...output.line_times import ENTRY, stamp

MAX_LINE = 1 << 20

Line = tuple[float | None, str, bytes]  # (time, label, bytes with their newline)


class LineReader:
    def __init__(self, log: Path, label: str):
        self.log = log
        self.index = log.with_suffix(".idx")
        self.label = label
        self.position = 0  # bytes of the log taken so far
        self._index_read = 0  # bytes of the index taken so far
        self._offsets: list[int] = []
        self._times: list[float] = []
        self._partial = b""
        self._partial_at: float | None = None

    def exists(self) -> bool:
        return self.log.exists()

    def _time_at(self, offset: int) -> float | None:
        n = bisect.bisect_right(self._offsets, offset)
        return self._times[n - 1] if n else None

    def _read_index(self) -> None:
        try:
            with open(self.index, "rb") as f:
                f.seek(self._index_read)
                raw = f.read()
        except FileNotFoundError:
            return
        usable = len(raw) - len(raw) % ENTRY.size
        self._index_read += usable
        for offset, at in ENTRY.iter_unpack(raw[:usable]):
            if not self._offsets or offset >= self._offsets[-1]:  # out of order: corrupt, skipped
                self._offsets.append(offset)
                self._times.append(at)

    def lines(self) -> list[Line]:
        """The complete lines written since the last call."""
        try:
            with open(self.log, "rb") as f:
                f.seek(self.position)
                data = f.read()
        except FileNotFoundError:
            return []
        if not data:
            return []
        self._read_index()
        start = self.position
        self.position += len(data)
        out: list[Line] = []
        begin = 0
        while True:
            end = data.find(b"\n", begin)
            if end < 0 and len(self._partial) + len(data) - begin < MAX_LINE:
                break
            end = begin + MAX_LINE - len(self._partial) - 1 if end < 0 else end
            at = self._partial_at if self._partial else self._time_at(start + begin)
            out.append((at, self.label, self._partial + data[begin : end + 1]))
            self._partial, self._partial_at = b"", None
            begin = end + 1
        if begin < len(data):
            if not self._partial:
                self._partial_at = self._time_at(start + begin)
            self._partial += data[begin:]
        return out

    def rest(self) -> list[Line]:
        """A last line without its newline, once."""
        if not self._partial:
            return []
        line = (self._partial_at, self.label, self._partial)
        self._partial, self._partial_at = b"", None
        return [line]


def merge(batches: list[list[Line]]) -> list[Line]:
    """Several streams' lines in the order they arrived (lines without a time keep their place
    at the start of their stream's batch)."""
    tagged = [
        (at if at is not None else float("-inf"), n, i, line)
        for n, batch in enumerate(batches)
        for i, line in enumerate(batch)
        for at in (line[0],)
    ]
    tagged.sort(key=lambda t: (t[0], t[1], t[2]))
    return [t[3] for t in tagged]


def render(line: Line, *, timestamps: bool, marker: bool) -> bytes:
    """One line as `ccsup logs` prints it: `[time ]<label> | bytes` (label only when `marker`),
    ending with a newline (a line cut at MAX_LINE, or the last one, gets one)."""
    at, label, data = line
    head = stamp(at) if timestamps else b""
    if marker:
        head += label.encode() + b" | "
    return head + data + (b"" if data.endswith(b"\n") else b"\n")
