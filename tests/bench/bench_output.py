"""What exact output costs the event loop per chunk; prints one JSON line.

The reference, measured in the same run, is the old path: `data.decode("utf-8", errors="replace")`
into the event body and `protocol.dumps`. The new path is `StreamSplitter.feed` +
`protocol.output_body` + `protocol.dumps`. Workloads (mixed Latin, CJK and emoji text):
- aligned_64k: 64 KiB reads that end on a character boundary (the common case);
- split_4093: 4093-byte reads, most ending mid-character (carry + one copy);
- invalid_64k: 64 KiB reads holding one invalid byte each (sent as base64).
Each figure is microseconds per read, the best of 5 rounds.

Run: .venv/bin/python tests/bench/bench_output.py
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from supervisor import protocol  # noqa: E402
from supervisor.output import StreamSplitter  # noqa: E402

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


def per_read_us(fn, chunks: list[bytes]) -> float:
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        fn(chunks)
        best = min(best, time.perf_counter() - start)
    return round(best / len(chunks) * 1e6, 2)


def main() -> None:
    total = 32 << 20
    workloads = {
        "aligned_64k": aligned(65536, total),
        "split_4093": reads(4093, total // 4, False),
        "invalid_64k": reads(65536, total, True),
    }
    result: dict[str, object] = {"bench": "output_chunk_cost"}
    for name, chunks in workloads.items():
        before, after = per_read_us(old, chunks), per_read_us(new, chunks)
        result[name] = {"old_us": before, "new_us": after, "ratio": round(after / before, 2)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
