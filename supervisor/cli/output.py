"""Copying a turn's output to our own stdout/stderr, exactly once per byte (`run`, `logs`): a
stream as its events come (OutputFollower), or both in the order they were written (MergedOutput)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import BinaryIO

from ..wire.protocol import ProtocolError, output_bytes


class OutputFollower:
    """Copies one stream of a turn to `out`, exactly once per byte.

    Output events carry the exact bytes (`data` or `data_b64`) at their byte offset, so `run`
    writes each event's bytes in place (`on_event`); a hole (events lost on the bus) is filled
    from the turn's log file, which has the same bytes at the same offsets (unless the log was
    cut at [logs] turn_max_bytes: then the hole's bytes are counted in `lost`). `logs -f` copies
    the log file itself (`drain`). Repeats write nothing.
    """

    def __init__(self, path: Path, out: BinaryIO):
        self.path = path
        self.out = out
        self.position = 0
        self.lost = 0  # bytes neither the bus nor the log could give
        self._file: BinaryIO | None = None

    def copy_from_file(self) -> bool:
        """Copy what the log file has past our position; False when it cannot be opened."""
        if self._file is None:
            try:
                self._file = open(self.path, "rb")
            except OSError:
                return False
        self._file.seek(self.position)
        data = self._file.read()
        if data:
            self.out.write(data)
            self.out.flush()
            self.position += len(data)
        return True

    def on_event(self, body: dict) -> None:
        try:
            offset, data = output_bytes(body)
        except ProtocolError:
            return  # not an output event's body
        if offset > self.position:
            self._fill(offset)
        end = offset + len(data)
        if end > self.position:
            self.out.write(data[self.position - offset :])
            self.out.flush()
            self.position = end

    def _fill(self, offset: int) -> None:
        """Bytes [position, offset) from the log; what it cannot give is counted as lost."""
        if self._file is None:
            try:
                self._file = open(self.path, "rb")
            except OSError:
                pass
        if self._file is not None:
            self._file.seek(self.position)
            data = self._file.read(offset - self.position)
            if data:
                self.out.write(data)
                self.position += len(data)
        if offset > self.position:
            self.lost += offset - self.position
            self.position = offset

    def drain(self) -> None:
        self.copy_from_file()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


class MergedOutput:
    """Both streams of a turn copied in the order CMD wrote them, as its guard's reads of the two
    pipes timed them (the logs' .idx files, supervisor.output.line_times): what `ccsup run` gives
    a harness that reads stdout and stderr through pipes, often one pipe for both (2>&1), where
    copying each stream as its events come would put a batch of one before the other.

    Each `pump` reads the new index entries of both streams and the logs' sizes, then writes, in
    time order, every read stamped at least LAG seconds before the pump began: the guard writes
    an entry the moment it stamps it, so by then every read of either stream up to that time is
    on file. Later reads wait for the next pump (`drain`, at the turn's end, writes all). So the
    order is exact at the guard's reads: two writes on the two streams closer than one read apart
    come out in the guard's read order. A log without an index is copied as it stands.

    Knows the turn's log and index files, nothing of the bus (events only say "look again").
    """

    LAG = 0.05  # seconds: a read stamped this long before a pump is on file

    def __init__(self, log_dir: Path, outs: dict[str, BinaryIO]):
        self.outs = outs
        self.log_dir = log_dir
        self.position = {stream: 0 for stream in outs}  # bytes of each log written
        self._index_at = {stream: 0 for stream in outs}  # bytes of each .idx read
        self._entries: dict[str, list[tuple[int, float]]] = {stream: [] for stream in outs}
        self.lost = 0

    def _read_entries(self, stream: str) -> None:
        from ..output.line_times import ENTRY

        try:
            with open(self.log_dir / f"{stream}.idx", "rb") as f:
                f.seek(self._index_at[stream])
                raw = f.read()
        except OSError:
            return
        usable = len(raw) - len(raw) % ENTRY.size
        self._index_at[stream] += usable
        entries = self._entries[stream]
        for offset, at in ENTRY.iter_unpack(raw[:usable]):
            if not entries or offset >= entries[-1][0]:
                entries.append((offset, at))  # out of order: corrupt; never reorder bytes

    def _size(self, stream: str) -> int:
        try:
            return os.stat(self.log_dir / f"{stream}.log").st_size
        except OSError:
            return 0

    def pump(self, final: bool = False) -> None:
        """Write what is on file up to LAG seconds ago (everything when `final`), in time order."""
        until = float("inf") if final else time.time() - self.LAG
        pieces: list[
            tuple[float, int, str, int, int]
        ] = []  # (time, stream no., stream, start, end)
        for n, stream in enumerate(self.outs):
            self._read_entries(stream)
            size = self._size(stream)
            entries = self._entries[stream]
            if not entries and size > self.position[stream]:  # no index: the log as it stands
                pieces.append((0.0, n, stream, self.position[stream], size))
            elif entries and entries[0][0] > self.position[stream]:  # bytes before the index's
                pieces.append((0.0, n, stream, self.position[stream], entries[0][0]))
            for i, (offset, at) in enumerate(entries):
                end = entries[i + 1][0] if i + 1 < len(entries) else size
                start = max(offset, self.position[stream])
                if end > start and at <= until:
                    pieces.append((at, n, stream, start, min(end, size)))
        pieces.sort()
        for _, _, stream, start, end in pieces:
            if start != self.position[stream]:
                break  # a hole before it (an entry not yet readable): the next pump
            data = self._read(stream, start, end)
            if not data:
                continue
            self.outs[stream].write(data)
            self.outs[stream].flush()
            self.position[stream] = start + len(data)
        for stream, entries in self._entries.items():  # forget the entries written whole
            while len(entries) > 1 and entries[1][0] <= self.position[stream]:
                entries.pop(0)

    def _read(self, stream: str, start: int, end: int) -> bytes:
        try:
            with open(self.log_dir / f"{stream}.log", "rb") as f:
                f.seek(start)
                return f.read(end - start)
        except OSError:
            return b""
