"""Hints on the bus: `guard.<turn>.group|exited|gone`, published when the guard runs with --bus.

Design note. Hints are advisory: a new PUB socket drops what it sends before the proxy's
subscriptions reach it, anyone may publish one, and nothing may depend on them. So publishing must
never slow or endanger the turn: zmq is imported, and the socket created and connected, in a
background thread started after CMD is spawned; the guard only appends to a queue. The thread waits
(bounded) for the connection handshake before sending, so the first hints are usually not dropped.
`close()` waits a short bounded time so the final `gone` is usually delivered; then the guard exits
regardless.

Holds no state beyond the process. Imports zmq only inside the thread.
"""

from __future__ import annotations

import json
import queue
import sys
import threading
import time

_CONNECT_WAIT = 0.2  # seconds to wait for the handshake before sending anyway
_SUBSCRIBE_SETTLE = 0.01  # the peer's subscriptions follow the handshake closely
_LINGER_MS = 300  # bound on delivering what is queued at close


class Publisher:
    def __init__(self, endpoint: str, turn: str, guard: dict):
        self.endpoint = endpoint
        self.turn = turn
        self.guard = guard
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="guard-hints", daemon=True)
        self._thread.start()

    def publish(self, event: str, **fields) -> None:
        body = {"v": 1, "ts": time.time(), "turn": self.turn, "guard": self.guard, **fields}
        self._queue.put((f"guard.{self.turn}.{event}".encode(), json.dumps(body).encode()))

    def close(self, timeout: float = 1.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        try:
            import zmq
        except ImportError as e:
            print(f"ccsup-guard: unable to publish hints on {self.endpoint}: {e}", file=sys.stderr)
            return
        ctx = zmq.Context()
        sock = ctx.socket(zmq.PUB)
        try:
            sock.setsockopt(zmq.LINGER, _LINGER_MS)
            monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
            sock.connect(self.endpoint)
            if monitor.poll(int(_CONNECT_WAIT * 1000)):
                time.sleep(_SUBSCRIBE_SETTLE)
            sock.disable_monitor()
            monitor.close(0)
            while True:
                item = self._queue.get()
                if item is None:
                    break
                sock.send_multipart(item)
        except zmq.ZMQError as e:
            print(f"ccsup-guard: unable to publish hints on {self.endpoint}: {e}", file=sys.stderr)
        finally:
            sock.close()
            ctx.term()
