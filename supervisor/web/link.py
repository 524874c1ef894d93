"""The web app's line to the supervisor: control calls and the bus, on the app's event loop.

Design note. The supervisor's own Client (supervisor.client) is synchronous and already knows the
hard parts (is a supervisor there, request ids, the bus hello handshake, `seq` gaps, CURVE keys).
Rather than write a second, asynchronous client, the link runs it in threads: control calls go to
one worker thread (a Client is not thread-safe; one thread owns it), and one reader thread holds
a subscription to the whole bus and hands each event to the loop with call_soon_threadsafe. A
rejected alternative was zmq.asyncio on the loop itself: it would copy the handshake and gap logic.

When no supervisor answers, the reader retries every RETRY seconds and the app shows "not
connected"; a supervisor that comes back (a restart) is picked up again, with a fresh `ps`.

Knows the Client and threads; nothing of HTTP or of what the page shows.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..client.control import Client
from ..client.subscription import Subscription
from ..errors import CcsupError

RETRY = 1.0  # seconds between attempts to reach a supervisor that is not there
POLL = 0.25  # seconds the reader waits for an event before it checks whether it should stop

OnEvent = Callable[[str, dict], None]
OnStatus = Callable[[bool, str | None], None]


class Link:
    """Control calls (`await link.call("ps")`) and a bus reader feeding `on_event` on the loop."""

    def __init__(
        self,
        state_dir: Path,
        endpoints: Any = None,
        *,
        timeout: float = 5.0,
        client_factory: Callable[..., Client] = Client,
    ):
        self.state_dir = state_dir
        self.endpoints = endpoints
        self.timeout = timeout
        self._make_client = client_factory
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ccsup-web")
        self._client: Client | None = None
        self._stop = threading.Event()
        self._reader: threading.Thread | None = None

    def _new_client(self) -> Client:
        return self._make_client(self.state_dir, endpoints=self.endpoints, timeout=self.timeout)

    # -- control

    def _call(self, cmd: str, args: dict) -> dict:
        if self._client is None:
            self._client = self._new_client()
        return self._client.call(cmd, **args)

    async def call(self, cmd: str, **args: Any) -> dict:
        """One control request; CcsupError (RemoteError, NotRunning) as the Client raises them."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._call, cmd, args)

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Other blocking work (reading /proc, a log file) off the loop, beside the calls."""
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    # -- the bus

    def start_reader(
        self, loop: asyncio.AbstractEventLoop, on_event: OnEvent, on_status: OnStatus
    ) -> None:
        self._reader = threading.Thread(
            target=self._read_bus,
            args=(loop, on_event, on_status),
            name="ccsup-web-bus",
            daemon=True,
        )
        self._reader.start()

    def _read_bus(
        self, loop: asyncio.AbstractEventLoop, on_event: OnEvent, on_status: OnStatus
    ) -> None:
        def tell(fn: Callable[..., None], *args: Any) -> None:
            try:
                loop.call_soon_threadsafe(fn, *args)
            except RuntimeError:  # the loop is closed: the app is ending
                self._stop.set()

        while not self._stop.is_set():
            client = self._new_client()
            sub: Subscription | None = None
            try:
                sub = client.subscribe(
                    "", on_gap=lambda first, last: tell(on_event, "ccsup.gap", {})
                )
                tell(on_status, True, None)
                idle = 0.0
                while not self._stop.is_set():
                    event = sub.recv(POLL)
                    if event is not None:
                        idle = 0.0
                        tell(on_event, *event)
                        continue
                    idle += POLL
                    if idle >= RETRY:
                        idle = 0.0
                        client.check_running()  # NotRunning when the supervisor is gone
            except CcsupError as e:
                tell(on_status, False, e.message)
            finally:
                if sub is not None:
                    sub.close()
                client.close()
            self._stop.wait(RETRY)

    def close(self) -> None:
        self._stop.set()
        if self._reader is not None:
            self._reader.join(timeout=2 * RETRY + POLL)
        self._executor.submit(self._close_client).result(timeout=5)
        self._executor.shutdown(wait=True)

    def _close_client(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
