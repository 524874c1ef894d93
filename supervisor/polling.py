"""Waiting for a condition by polling it: the one wait-until loop of ccsup's code and tests.

For conditions nothing announces (a lock freed by a process that exits, a group emptied, a daemon
that starts answering). Where an event exists (a pidfd, a socket, a bus topic), wait for the event
instead. Blocking (it sleeps): never for the supervisor's event loop; run it in a thread there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T],
    timeout: float = 10.0,
    interval: float = 0.01,
    what: str = "condition",
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], object] = time.sleep,
) -> T:
    """The first truthy value of predicate(), called every `interval` seconds (and once more at
    the deadline); TimeoutError naming `what` when `timeout` seconds pass without one."""
    deadline = clock() + timeout
    while True:
        value = predicate()
        if value:
            return value
        left = deadline - clock()
        if left <= 0:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        sleep(min(interval, left))
