"""Giving freed heap memory back to the kernel after work (glibc's malloc_trim).

Design note. glibc keeps what a thread frees in that thread's arena and returns to the kernel
only the free space at an arena's top. ZeroMQ's I/O thread allocates its buffers for every
connection, so the guards' hint connections (each guard holds one while it starts, see
guardd.hints) leave its arena full of free holes after 500 turns start: 3.5 MiB of RSS that
nothing uses, found with gdb (`thread_arena` of each thread) and /proc/<pid>/smaps; a `ps`
answer leaves the same in the worker thread that reads the guard records. `malloc_trim(0)` gives
back every whole free page of every arena (MADV_DONTNEED); the next allocation there faults the
page in again.

When: at most once every TRIM_INTERVAL, after the process (all its threads) used at least
TRIM_AFTER_CPU of CPU since the last trim: work is what allocates, and an idle supervisor is left
alone. The call runs in a worker thread (it takes each arena's lock in turn, up to ~12 ms after
500 turns started; nothing of it needs the event loop). Without glibc's malloc_trim (musl), it
does nothing.

Rejected: M_ARENA_MAX=1 (everything in the main heap: 1.4 MiB less, as the main heap keeps its
middle holes too); a lower mmap threshold (every large Python object its own mmap).

State: none.
"""

from __future__ import annotations

import asyncio
import ctypes
import time
from collections.abc import Callable

TRIM_INTERVAL = 1.0  # seconds between two looks
TRIM_AFTER_CPU = 0.01  # seconds of CPU, all threads, since the last trim


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


class Trimmer:
    """One look at a time (`step`): trim when the process worked since the last trim."""

    def __init__(
        self,
        *,
        after_cpu: float = TRIM_AFTER_CPU,
        trim: Callable[[int], int] | None = None,
        cpu: Callable[[], float] = time.process_time,
    ):
        self.trim = trim or _malloc_trim()
        self.after_cpu = after_cpu
        self.cpu = cpu
        self.trimmed_at = cpu()

    async def step(self) -> None:
        if self.trim is not None and self.cpu() - self.trimmed_at >= self.after_cpu:
            await asyncio.to_thread(self.trim, 0)
            self.trimmed_at = self.cpu()


async def trim_after_work(
    *,
    interval: float = TRIM_INTERVAL,
    after_cpu: float = TRIM_AFTER_CPU,
    trim: Callable[[int], int] | None = None,
    cpu: Callable[[], float] = time.process_time,
) -> None:
    """Run for the supervisor's life (a task): trim whenever the process has worked."""
    trimmer = Trimmer(after_cpu=after_cpu, trim=trim, cpu=cpu)
    if trimmer.trim is None:
        return
    while True:
        await asyncio.sleep(interval)
        await trimmer.step()
