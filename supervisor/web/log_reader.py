"""A turn's log file read from an offset, decoded as UTF-8 across chunk edges.

Knows the log file's bytes and UTF-8; nothing of HTTP, streams or the supervisor. Its reads are
blocking file I/O: the app runs them in a worker thread (Link.run), never on the event loop.
Each read returns at most READ_CHUNK bytes' worth, so a long log is sent in bounded pieces.

State: the offset reached and the decoder's unfinished character, in memory; a file that is
missing (not yet written, or pruned) reads as nothing new; a file that grows is read on.
"""

from __future__ import annotations

import codecs
import os
from pathlib import Path

READ_CHUNK = 64 * 1024


class LogReader:
    """A turn's log file read from an offset, decoded as UTF-8 across chunk edges.

    `tail`: start at most this many bytes before the end as it is at the first read (moved
    forward past UTF-8 continuation bytes, so the first character is whole); `skipped` says how
    many bytes were left out before it.
    """

    def __init__(self, path: Path, tail: int | None = None):
        self.path = path
        self.offset = 0
        self.tail = tail
        self.skipped = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def _start(self, f) -> None:
        size = os.fstat(f.fileno()).st_size
        if self.tail is None or size <= self.tail:
            return
        f.seek(size - self.tail)
        head = f.read(4)
        lead = next((i for i, b in enumerate(head) if b & 0xC0 != 0x80), len(head))
        self.offset = self.skipped = size - self.tail + lead

    def read(self) -> tuple[int, str] | None:
        """(offset of the text, text) of what is new, None when nothing is."""
        try:
            with open(self.path, "rb") as f:
                if self.tail is not None:
                    self._start(f)
                    self.tail = None
                f.seek(self.offset)
                data = f.read(READ_CHUNK)
        except FileNotFoundError:
            return None
        if not data:
            return None
        start = self.offset
        self.offset += len(data)
        return start, self._decoder.decode(data)

    def finish(self) -> str:
        return self._decoder.decode(b"", final=True)
