"""Copying a turn's output to our own stdout/stderr, exactly once per byte (`run`, `logs`)."""

from __future__ import annotations

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
