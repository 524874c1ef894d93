"""Where the cluster's threads meet the event loop: a small pool for blocking etcd calls, posting
from a thread to the loop, tasks, and retries.

What it knows: the event loop it was attached to, a pool of two threads for blocking calls, the
tasks it started (to cancel them at close), and `closing`, the one flag that says the cluster
gate is shutting down (every part of the gate reads it here). What it does not know: etcd, keys,
leases or turns.

Design note. Blocking HTTP never runs on the event loop: the keep-alive and the watch each have a
thread of their own (supervisor.cluster.lease, supervisor.cluster.watch); every other call runs in
this pool (`run`). Threads only `post` results to the loop; every decision is made on the loop.

State: none stored; everything here lives as long as the gate.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger("ccsup.cluster")

RETRY = 0.25  # seconds between attempts while etcd does not answer


class LoopBridge:
    """See the module docstring. `post` may be called from any thread; the rest on the loop."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.closing = False
        self._pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="ccsup-etcd")
        self._tasks: set[asyncio.Task] = set()

    def attach(self) -> None:
        """On the loop, at start: the loop that threads post to."""
        self.loop = asyncio.get_running_loop()

    async def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """fn(*args, **kwargs) in the pool; its answer (or exception) on the loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(*args, **kwargs))

    def post(self, fn: Callable[..., None], *args: Any) -> None:
        """From a thread: fn(*args) on the loop, soon; nothing once the loop is closed."""
        loop = self.loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(fn, *args)

    def later(self, fn: Callable[..., Any], *args: Any) -> None:
        """Try again after RETRY (a coroutine function is run as a task)."""
        if self.closing or self.loop is None:
            return

        def again() -> None:
            if self.closing:
                return
            result = fn(*args)
            if asyncio.iscoroutine(result):
                self.spawn(result)

        self.loop.call_later(RETRY, again)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def cancel_tasks(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("cluster: a task failed", exc_info=task.exception())
