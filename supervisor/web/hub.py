"""The web app's live side: the page's model kept fresh, and every open stream fed from it.

Design note. The app is a client: it holds no supervisor state of its own beyond what the page
shows (supervisor.web.live), re-reads `ps` when an event says something changed (coalesced, at
most every REFRESH_MIN seconds, and every REFRESH_MAX seconds regardless, so ages and CPU move),
and pushes one snapshot to every open page. A page that cannot keep up (its queue full) is
dropped; its EventSource reconnects and gets a fresh snapshot. Per-connection memory is bounded.
CPU and memory of the running turns are sampled every USAGE_EVERY seconds, and only while some
page looks. An output stream registers a waker per turn; a bus event of that turn sets it.

Knows the Link (calls, the bus, the worker threads), the Live model, the history's bars and
past turns, and the queues of the open streams; nothing of HTTP, routes, access or how a stream
is written on the wire (supervisor.web.app).

State: memory only; a restarted app starts empty and reads `ps` at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from ..errors import CcsupError
from ..paths import StatePaths
from . import usage as usage_mod
from .link import Link
from .live import KEEP_SECONDS, Live, TurnView
from .timeline import history_bars, past_turn, recent_bars

REFRESH_MIN = 0.1  # seconds between two `ps` reads at most
REFRESH_MAX = 2.0  # seconds between two `ps` reads at least
USAGE_EVERY = 2.0  # seconds between two CPU/memory samples of the running turns
STREAM_QUEUE = 64  # messages a slow page may be behind before it is dropped


class Hub:
    """The live model, its refresher and the open streams, on the app's event loop."""

    def __init__(self, link: Link, state_dir: Path):
        self.link = link
        self.paths = StatePaths(state_dir)
        self.live = Live()
        self.usage: dict[str, tuple[float, int]] = {}
        self.streams: set[asyncio.Queue[tuple[str, Any] | None]] = set()
        self.output_wakers: dict[str, set[asyncio.Event]] = {}
        self._dirty = asyncio.Event()
        self._tasks: list[asyncio.Task] = []

    # -- in

    def on_event(self, topic: str, body: dict) -> None:
        if topic == "ccsup.gap":
            self._dirty.set()
            return
        if self.live.apply_event(topic, body):
            self._dirty.set()
        parts = topic.split(".")
        if parts[0] == "turn" and len(parts) >= 3:
            turn_id = ".".join(parts[1:-1])
            for waker in self.output_wakers.get(turn_id, ()):
                waker.set()
            if parts[-1] not in ("stdout", "stderr"):
                self._broadcast("turn", turn_id)

    def on_status(self, connected: bool, reason: str | None) -> None:
        if connected:
            self._dirty.set()
        else:
            self.live.lost(reason or "not connected")
            self._broadcast("state", None)

    # -- the refresher

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.link.start_reader(loop, self.on_event, self.on_status)
        self._tasks = [
            asyncio.create_task(self._refresh_loop(), name="ccsup-web-refresh"),
            asyncio.create_task(self._usage_loop(), name="ccsup-web-usage"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for queue in list(self.streams):
            self._close_stream(queue)
        await asyncio.get_running_loop().run_in_executor(None, self.link.close)

    async def refresh(self) -> None:
        asked_at = self.live.clock()
        try:
            ps = await self.link.call("ps")
            status = await self.link.call("status")
        except CcsupError as e:
            self.live.lost(e.message)
        else:
            self.live.apply_ps(ps, status, asked_at)
            self.live.expire()
        self._broadcast("state", None)
        changed = self.live.take_changed_bars()
        if changed:
            self._broadcast("bars", {"full": False, "bars": changed})

    async def _refresh_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(REFRESH_MAX):
                    await self._dirty.wait()
            self._dirty.clear()
            await self.refresh()
            await asyncio.sleep(REFRESH_MIN)

    async def _usage_loop(self) -> None:
        while True:
            if not self.streams:  # nobody looks: no pass over /proc
                self.usage = {}
                await asyncio.sleep(USAGE_EVERY)
                continue
            works = usage_mod.works_of(self.live.ps.get("slots", []))
            samples = await self.link.run(usage_mod.sample, works)
            self.usage = {turn: (s.cpu_seconds, s.rss_bytes) for turn, s in samples.items()}
            await asyncio.sleep(USAGE_EVERY)

    # -- out

    def state(self) -> dict:
        return dict(self.live.state(self.usage))

    async def bars(self) -> list:
        since = time.time() - KEEP_SECONDS
        past = await self.link.run(history_bars, self.paths.root, since)
        return list(recent_bars(self.live, since, past))

    async def turn(self, turn_id: str) -> TurnView | None:
        """A turn's view: what the bus showed, else (or when it showed no event) the history's."""
        view = self.live.turn(turn_id)
        if view is None or not view["events"]:
            past = await self.link.run(past_turn, self.paths.root, turn_id)
            if past is not None:
                if view is not None:
                    past["active"] = view["active"]
                return past
        return view

    def _broadcast(self, kind: str, data: Any) -> None:
        for queue in list(self.streams):
            try:
                queue.put_nowait((kind, data))
            except asyncio.QueueFull:
                self._close_stream(queue)

    def _close_stream(self, queue: asyncio.Queue) -> None:
        self.streams.discard(queue)
        with contextlib.suppress(asyncio.QueueFull):
            queue.put_nowait(None)

    @contextlib.asynccontextmanager
    async def stream(self) -> AsyncIterator[asyncio.Queue[tuple[str, Any] | None]]:
        queue: asyncio.Queue[tuple[str, Any] | None] = asyncio.Queue(STREAM_QUEUE)
        self.streams.add(queue)
        try:
            yield queue
        finally:
            self.streams.discard(queue)
