"""A turn's output stream cut into bus chunks: exact bytes, whole characters, tiling the log.

Design note. The guard's pipes deliver bytes in reads of any size, so a UTF-8 character can be
split between two reads. Decoding each read on its own (with replacement) destroyed those
characters and could not carry bytes that are not UTF-8 at all. A `StreamSplitter` per stream
holds back a trailing *incomplete* sequence (at most 3 bytes that more bytes could complete) and
puts it in front of the next read; what it emits is then either valid UTF-8, sent as text, or
not, sent as the exact bytes (base64 on the bus: see protocol.output_body). Every chunk carries
the byte offset of its first byte in the stream, and the chunks follow one another with no gap
or overlap, so `offset` is also the chunk's place in `<state>/turns/<id>/<stream>.log`.

Cost: the common case (a read that is valid UTF-8 and ends on a character boundary) is one
strict `bytes.decode`, exactly what the old `errors="replace"` decode cost; only a read that
ends mid-character or holds invalid bytes pays for a second look at its last 3 bytes and one
copy. Rejected: `codecs` incremental decoders, which cannot say which bytes were invalid, and a
per-read split into text and binary runs, which would turn one read into many events.

A held-back tail is released by the next read or by `finish()` at the stream's end (then as
bytes: it is incomplete for good). So a writer that stops in the middle of a character delays
those 1-3 bytes on the bus until it writes again or ends; the log has them at once.

State: none on disk; one splitter per stream of a running turn, lost with the supervisor (the
log keeps the bytes).
"""

from __future__ import annotations

from typing import NamedTuple

from ..wire.protocol import output_body


class Chunk(NamedTuple):
    """One piece of a stream: its byte offset, its bytes, and its text when they are UTF-8."""

    offset: int
    data: bytes
    text: str | None

    def body(self, turn_id: str) -> dict:
        """The body of its `turn.<id>.stdout|stderr` event."""
        return output_body(turn_id, self.offset, self.data, self.text)


def complete_length(data: bytes) -> int:
    """len(data) less a trailing incomplete UTF-8 sequence that further bytes could complete."""
    n = len(data)
    for back in range(1, min(4, n) + 1):
        lead = data[n - back]
        if lead & 0xC0 == 0x80:
            continue  # a continuation byte: the sequence starts further back
        if 0xC2 <= lead <= 0xDF:
            need = 2
        elif 0xE0 <= lead <= 0xEF:
            need = 3
        elif 0xF0 <= lead <= 0xF4:
            need = 4
        else:
            return n  # ASCII or a byte no sequence starts with: nothing to wait for
        if need <= back:
            return n  # complete (or invalid): nothing to wait for
        try:
            data[n - back :].decode()
        except UnicodeDecodeError as e:
            # A valid prefix fails only with this reason; "invalid continuation byte" cannot
            # become valid by waiting.
            if e.reason == "unexpected end of data":
                return n - back
        return n
    return n


class StreamSplitter:
    """Cuts one stream's reads into Chunks that never split a character."""

    def __init__(self, offset: int = 0):
        self.offset = offset  # the stream offset of the next byte to emit (the carry's first)
        self._carry = b""

    def feed(self, data: bytes) -> Chunk | None:
        """The chunk to publish for this read (None when it only completes nothing yet)."""
        if self._carry:
            data = self._carry + data
            self._carry = b""
        try:
            text: str | None = data.decode()
        except UnicodeDecodeError:
            cut = complete_length(data)
            if cut < len(data):
                data, self._carry = data[:cut], data[cut:]
            try:
                text = data.decode()
            except UnicodeDecodeError:
                text = None
        if not data:
            return None
        chunk = Chunk(self.offset, data, text)
        self.offset += len(data)
        return chunk

    def finish(self) -> Chunk | None:
        """At the stream's end: what is held back, as bytes (it can no longer be completed)."""
        data, self._carry = self._carry, b""
        if not data:
            return None
        chunk = Chunk(self.offset, data, None)
        self.offset += len(data)
        return chunk
