"""The quota readers at 1, 10 and 100 times a turn's output, in the same run.

    .venv/bin/python tests/bench/bench_quota.py [--mb 1] [--runs 3]

A Claude Code stream-json turn's stdout of MB, 10 MB and 100 MB (assistant lines of about 1 KiB,
one rate_limit_event in every 1,000 lines, in 64 KiB chunks as a guard's pipe gives them) is fed
to QuotaReaders as the supervisor feeds it: `loop_ms_per_mb` is the time the feeding side (the
event loop's share: one queue put per chunk) spends per MiB, `thread_ms_per_mb` the reader
thread's time from the first chunk to the ended turn's answer per MiB (line splitting and the
parsers), the medians of --runs. `*_ratio_100x` = per-MiB cost at 100x / at 1x (about 1: the
cost grows with the output, not faster). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from supervisor.admission.quota_readers import QuotaReaders  # noqa: E402


def output(mb: float) -> list[bytes]:
    filler = json.dumps({"type": "assistant", "message": {"content": [{"text": "x" * 900}]}})
    event = json.dumps({"type": "rate_limit_event", "rate_limit_info": {
        "status": "allowed", "resetsAt": time.time() + 3600, "rateLimitType": "five_hour",
        "unifiedWindows": {"five_hour": {"utilization": 0.5, "resetsAt": time.time() + 3600}}}})  # fmt: skip
    lines, size, i = [], 0, 0
    while size < mb * (1 << 20):
        line = (event if i % 1000 == 999 else filler) + "\n"
        lines.append(line)
        size += len(line)
        i += 1
    data = "".join(lines).encode()
    return [data[at : at + 65536] for at in range(0, len(data), 65536)]


def once(chunks: list[bytes]) -> tuple[float, float, int]:
    got: list[object] = []
    done = threading.Event()
    readers = QuotaReaders(
        frozenset({"claude"}),
        lambda key, reading: got.append(reading),
        lambda what: None,
        lambda f, *args: f(*args),  # the thread's posts run at once (no loop in a bench)
    )
    readers.turn_started("t", "claude", Path("/nonexistent"))
    started = time.perf_counter()
    for chunk in chunks:
        readers.output("t", "stdout", chunk)
    fed = time.perf_counter()
    readers.turn_ended("t", done.set)
    done.wait(600)
    ended = time.perf_counter()
    readers.close()
    return fed - started, ended - started, len(got)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=float, default=1.0)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    result: dict[str, object] = {"bench": "quota_readers"}
    per_mb = {}
    for scale in (1, 10, 100):
        mb = args.mb * scale
        chunks = output(mb)
        runs = [once(chunks) for _ in range(args.runs)]
        loop = statistics.median(r[0] for r in runs) * 1000 / mb
        thread = statistics.median(r[1] for r in runs) * 1000 / mb
        per_mb[scale] = (loop, thread)
        result[f"x{scale}"] = {"mb": mb, "loop_ms_per_mb": round(loop, 3),
                               "thread_ms_per_mb": round(thread, 2), "readings": runs[0][2]}  # fmt: skip
    result["loop_ratio_100x"] = round(per_mb[100][0] / per_mb[1][0], 2)
    result["thread_ratio_100x"] = round(per_mb[100][1] / per_mb[1][1], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
