"""What exact output costs the event loop per chunk; prints one JSON line.

The reference, measured in the same run, is the old path: `data.decode("utf-8", errors="replace")`
into the event body and `protocol.dumps`. The new path is `StreamSplitter.feed` +
`protocol.output_body` + `protocol.dumps`. Workloads (mixed Latin, CJK and emoji text):
- aligned_64k: 64 KiB reads that end on a character boundary (the common case);
- split_4093: 4093-byte reads, most ending mid-character (carry + one copy);
- invalid_64k: 64 KiB reads holding one invalid byte each (sent as base64).
Each figure is microseconds per read, the best of 5 rounds.

Also what else the event loop pays per event since this work (microseconds, best of 5):
- observe_output_us / observe_lifecycle_us: the history and metrics observers together, for an
  output event (they skip it) and for a lifecycle event (a queue put and a few additions);
- index_write_us against log_write_64k_us: the 16-byte `.idx` entry written with each read,
  beside the read's own 64 KiB append to the log (unbuffered files in a temporary directory).

Run: .venv/bin/python tests/bench/bench_output.py
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from supervisor.output.chunks import StreamSplitter  # noqa: E402
from supervisor.wire import protocol

TEXT = ("Grüße, 世界! 😀 naïve café ½ " * 2000).encode()


def reads(size: int, total: int, invalid: bool) -> list[bytes]:
    out, pos = [], 0
    while len(out) * size < total:
        piece = TEXT[pos : pos + size]
        if len(piece) < size:
            pos = 0
            continue
        pos += size
        out.append(piece[:100] + b"\xff" + piece[101:] if invalid else piece)
    return out


def aligned(size: int, total: int) -> list[bytes]:
    chunks = []
    for piece in reads(size, total, False):
        cut = len(piece)
        while True:  # end on a boundary
            try:
                piece[:cut].decode()
                break
            except UnicodeDecodeError:
                cut -= 1
        chunks.append(piece[:cut])
    return chunks


def old(chunks: list[bytes]) -> None:
    offset = 0
    for data in chunks:
        protocol.dumps(
            {"id": "t", "offset": offset, "data": data.decode("utf-8", errors="replace")}
        )
        offset += len(data)


def new(chunks: list[bytes]) -> None:
    splitter = StreamSplitter()
    for data in chunks:
        chunk = splitter.feed(data)
        if chunk is not None:
            protocol.dumps(protocol.output_body("t", chunk.offset, chunk.data, chunk.text))


def compare(chunks: list[bytes]) -> tuple[float, float]:
    """Per-read microseconds of old and new, best of 7 rounds each, the two interleaved so that
    the machine's load falls on both alike."""
    best = {old: float("inf"), new: float("inf")}
    for _ in range(7):
        for fn in (old, new):
            start = time.perf_counter()
            fn(chunks)
            best[fn] = min(best[fn], time.perf_counter() - start)
    return round(best[old] / len(chunks) * 1e6, 2), round(best[new] / len(chunks) * 1e6, 2)


def per_call_us(fn, n: int = 20000) -> float:
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, time.perf_counter() - start)
    return round(best / n * 1e6, 3)


def observers_and_index() -> dict[str, float]:
    import tempfile

    from supervisor.history.metrics import Metrics
    from supervisor.history.writer import Recorder
    from supervisor.output import line_times

    with tempfile.TemporaryDirectory() as tmp:
        recorder = Recorder(Path(tmp))  # not started: observe only queues
        metrics = Metrics(ps=lambda: {})
        out = protocol.event_body(
            {"id": "t", "offset": 0, "data": "x"}, seq=1, counters={"turn_seq": 1}
        )
        life = protocol.event_body(
            {"id": "t", "key": "k", "index": 0}, seq=1, counters={"turn_seq": 1}
        )

        def output_event() -> None:
            recorder.observe("turn.t.stdout", out)
            metrics.observe("turn.t.stdout", out)

        def lifecycle_event() -> None:
            recorder.observe("turn.t.granted", life)
            metrics.observe("turn.t.granted", life)

        result = {
            "observe_output_us": per_call_us(output_event),
            "observe_lifecycle_us": per_call_us(lifecycle_event),
        }
        with (
            open(Path(tmp) / "x.idx", "ab", buffering=0) as idx,
            open(Path(tmp) / "x.log", "ab", buffering=0) as log,
        ):
            block = TEXT[:65536]
            result["index_write_us"] = per_call_us(lambda: idx.write(line_times.entry(0, 1.0)))
            result["log_write_64k_us"] = per_call_us(lambda: log.write(block), 2000)
    return result


def main() -> None:
    total = 32 << 20
    workloads = {
        "aligned_64k": aligned(65536, total),
        "split_4093": reads(4093, total // 4, False),
        "invalid_64k": reads(65536, total, True),
    }
    result: dict[str, object] = {"bench": "output_chunk_cost"}
    for name, chunks in workloads.items():
        before, after = compare(chunks)
        result[name] = {"old_us": before, "new_us": after, "ratio": round(after / before, 2)}
    result.update(observers_and_index())
    print(json.dumps(result))


if __name__ == "__main__":
    main()
