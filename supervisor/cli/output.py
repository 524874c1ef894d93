"""Copying a turn's output to our own stdout/stderr, exactly once per byte (`run`, `logs`)."""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO


class OutputFollower:
    """Copies one stream of a turn to `out`, exactly once per byte.

    The bus carries the output decoded as UTF-8 with replacement; the exact bytes are in the turn's
    log file, so an event is taken as "there is more" and the bytes are read from the file from
    our own position. Only when the file cannot be read does the event's text serve, placed by its
    offset so that nothing is written twice.
    """

    def __init__(self, path: Path, out: BinaryIO):
        self.path = path
        self.out = out
        self.position = 0
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
        if self.copy_from_file():
            return
        data = str(body.get("data", "")).encode()
        offset = body.get("offset")
        offset = self.position if not isinstance(offset, int) else offset
        end = offset + len(data)
        if end > self.position:
            self.out.write(data[max(0, self.position - offset) :])
            self.out.flush()
            self.position = end

    def drain(self) -> None:
        self.copy_from_file()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
