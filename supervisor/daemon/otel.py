"""`[otel] endpoint`: one OpenTelemetry span per turn, exported over OTLP/HTTP (JSON).

Design note. The supervisor already hands every event it publishes to its observers (the history,
the metrics); this one keeps, per running turn, the few times a span needs (queued, started,
stopping) and, at the turn's terminal event, makes its span: `ccsup.turn` from the request to the
end, with the turn's `ccsup.turn.id`, `ccsup.key`, `ccsup.session`, `ccsup.agent` (the same
attributes its environment carries: supervisor.turns.telemetry) and `ccsup.outcome`, exit code
and signal, and the span events `waiting`, `running` and `stopping` when they happened. Spans go
to a bounded queue that one thread of its own sends to `<endpoint>/v1/traces` (the OTLP/HTTP
JSON encoding, with the standard library's urllib: no new dependency), a batch at a time. The
event loop pays a dict update per event and a queue put per turn; a collector that is down or slow
costs the thread, never the loop: a failed send is logged (once per run of failures) and its
spans dropped, and past QUEUE spans waiting the newest are dropped and counted.

State: memory only. A turn that was running at a restart gets no span from the supervisor that
adopts it (it did not see it start); spans not yet sent when the supervisor stops are lost.
Reservations get none. Knows events' shapes and OTLP's; nothing of turns' logic.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
import urllib.error
import urllib.request
from typing import Any

log = logging.getLogger("ccsup.otel")

QUEUE = 10_000  # spans waiting to be sent
BATCH = 512  # spans a request carries at most
TIMEOUT = 5.0  # seconds a send may take
TERMINAL = ("released", "cancelled", "rejected")
SPAN_EVENTS = {"queued": "waiting", "started": "running", "stopping": "stopping"}
_KINDS = {"queued", "granted", "started", "stopping", "exited", *TERMINAL}


def _attr(key: str, value: object) -> dict[str, Any] | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    return {"key": key, "value": {"stringValue": str(value)}}


def _nanos(ts: float) -> str:
    return str(int(ts * 1e9))


class SpanExporter:
    def __init__(self, endpoint: str, service: str = "ccsup"):
        self.url = endpoint.rstrip("/") + "/v1/traces"
        self.service = service
        self.turns: dict[str, dict[str, Any]] = {}
        self.queue: queue.Queue[dict[str, Any] | None] = queue.Queue(QUEUE)
        self.dropped = 0
        self.sent = 0
        self._failing = False
        self._thread = threading.Thread(target=self._send_loop, name="ccsup-otel", daemon=True)
        self._thread.start()

    # -- on the event loop -----------------------------------------------------------------------

    def observe(self, topic: str, body: dict) -> None:
        if not topic.startswith("turn.") or body.get("reservation") is True:
            return
        turn_id, _, kind = topic[5:].rpartition(".")
        if kind not in _KINDS:
            return
        ts = body.get("ts")
        ts = float(ts) if isinstance(ts, int | float) else time.time()
        seen = self.turns.setdefault(turn_id, {"key": body.get("key"), "events": []})
        if kind in SPAN_EVENTS:
            seen["events"].append((SPAN_EVENTS[kind], ts))
        if kind == "queued":
            seen["start"] = ts
            holder = body.get("holder")
            holder = holder if isinstance(holder, dict) else {}
            seen["session"], seen["agent"] = holder.get("session"), holder.get("agent")
        elif kind == "exited":
            seen["exit"] = body
        elif kind in TERMINAL:
            del self.turns[turn_id]
            if "start" not in seen:
                return  # its start was not seen here (adopted, or before this supervisor)
            try:
                self.queue.put_nowait(self._span(turn_id, kind, ts, seen, body))
            except queue.Full:
                self.dropped += 1

    def _span(
        self, turn_id: str, kind: str, end: float, seen: dict[str, Any], body: dict
    ) -> dict[str, Any]:
        exited = seen.get("exit") or {}
        attributes = [
            _attr("ccsup.turn.id", turn_id),
            _attr("ccsup.key", seen.get("key")),
            _attr("ccsup.session", seen.get("session")),
            _attr("ccsup.agent", seen.get("agent")),
            _attr("ccsup.end", kind),
            _attr("ccsup.reason", exited.get("reason") or body.get("reason")),
            _attr("ccsup.exit_code", exited.get("code")),
            _attr("ccsup.signal", exited.get("signal")),
        ]
        failed = kind != "released" or exited.get("code") not in (0, None)
        return {
            "traceId": os.urandom(16).hex(),
            "spanId": os.urandom(8).hex(),
            "name": "ccsup.turn",
            "kind": 1,  # SPAN_KIND_INTERNAL
            "startTimeUnixNano": _nanos(seen["start"]),
            "endTimeUnixNano": _nanos(end),
            "attributes": [a for a in attributes if a is not None],
            "events": [{"name": n, "timeUnixNano": _nanos(t)} for n, t in seen["events"]],
            "status": {"code": 2 if failed else 1},  # ERROR / OK
        }

    def close(self, timeout: float = 2.0) -> None:
        """Send what is queued (for up to `timeout`), then stop the thread."""
        try:
            self.queue.put(None, timeout=timeout)
        except queue.Full:
            return
        self._thread.join(timeout)

    # -- the sending thread ----------------------------------------------------------------------

    def _send_loop(self) -> None:
        while True:
            first = self.queue.get()
            if first is None:
                return
            spans = [first]
            stop = False
            while len(spans) < BATCH:
                try:
                    more = self.queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                    break
                spans.append(more)
            self._send(spans)
            if stop:
                return

    def _send(self, spans: list[dict[str, Any]]) -> None:
        payload = {
            "resourceSpans": [
                {
                    "resource": {"attributes": [_attr("service.name", self.service)]},
                    "scopeSpans": [{"scope": {"name": "ccsup"}, "spans": spans}],
                }
            ]
        }
        request = urllib.request.Request(
            self.url,
            data=json.dumps(payload, separators=(",", ":")).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
                answer.read()
        except (OSError, urllib.error.URLError, ValueError) as e:
            self.dropped += len(spans)
            if not self._failing:
                log.warning("unable to send %d span(s) to %s: %s", len(spans), self.url, e)
            self._failing = True
            return
        if self._failing:
            log.info("spans reach %s again", self.url)
        self._failing = False
        self.sent += len(spans)
