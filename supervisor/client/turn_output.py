"""A turn's stdout and stderr reassembled exactly from its output events: the sidecar's helper.

Each `turn.<id>.stdout|stderr` event carries the byte offset of its chunk in the stream (and its
log), so the chunks tile each stream; see docs/sidecars.md, "Exact output". `TurnOutput.feed`
gives each event's new bytes in stream order, fills a hole from the turn's log when it is given a
`fill` (Client.read_log on the supervisor's machine), and otherwise raises OutputGap: it never
yields a stream with a hole.

Knows the output bodies (protocol.output_bytes) and offsets; nothing of sockets, subscriptions or
where a log lives. State: the position reached in each stream, in memory only.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import CcsupError
from ..wire import protocol


class OutputGap(CcsupError):
    """Output events were lost: `stream` bytes [expected, got) never arrived."""

    def __init__(self, turn_id: str, stream: str, expected: int, got: int):
        super().__init__(
            f"turn {turn_id}: {stream} bytes {expected} to {got} were lost on the bus; they are "
            f"in its {stream}.log (Client.read_log)"
        )
        self.stream = stream
        self.expected = expected
        self.got = got


class TurnOutput:
    """Reassembles a turn's stdout and stderr from its events, exactly: the sidecar's helper.

        out = TurnOutput(turn_id, fill=partial(client.read_log, turn_id))
        for topic, body in client.run_turn(...):
            got = out.feed(topic, body)   # (stream, exact bytes) or None
    `feed` returns an output event's exact bytes (text events are UTF-8, `data_b64` ones are
    decoded) in stream order; any other event gives None. Offsets tile each stream, so a chunk
    that starts past `position[stream]` means events were lost: `fill(stream, start, end)`
    supplies the missing bytes when given, else OutputGap is raised. A chunk already seen is
    ignored (only its new part counts).
    """

    def __init__(self, turn_id: str, fill: Callable[[str, int, int], bytes] | None = None):
        self.turn_id = turn_id
        self.fill = fill
        self.position = {"stdout": 0, "stderr": 0}

    def feed(self, topic: str, body: dict) -> tuple[str, bytes] | None:
        stream = topic.rsplit(".", 1)[-1]
        if stream not in self.position or not topic.startswith(f"turn.{self.turn_id}."):
            return None
        offset, data = protocol.output_bytes(body)
        position = self.position[stream]
        if offset > position:
            if self.fill is None:
                raise OutputGap(self.turn_id, stream, position, offset)
            missing = self.fill(stream, position, offset)
            if len(missing) != offset - position:
                raise OutputGap(self.turn_id, stream, position + len(missing), offset)
            data = missing + data
        elif offset < position:
            data = data[position - offset :]
        self.position[stream] += len(data)
        return stream, data
