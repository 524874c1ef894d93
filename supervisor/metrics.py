"""The supervisor's figures in the Prometheus exposition format (prometheus_client).

Design note. Like the history, the counters and histograms are fed by the events the supervisor
publishes (`Metrics.observe`, one dict lookup and a few additions per lifecycle event; output
events cost one startswith), so they say exactly what the bus said. The gauges of slots and
waiters are read when the text is asked for, from the same `ps` answer the CLI shows, on the
event loop: `exposition()` runs there (the control command `metrics`), and the HTTP listener's
thread hands each request to the loop (`run_coroutine_threadsafe`) instead of reading the
supervisor's state from another thread. The registry is this object's own, never the global one
(two supervisors in one test process must not share figures).

Rejected: prometheus_client's `start_http_server`, whose collectors would run in its thread;
pushing to a gateway (a scrape is what Prometheus expects of a daemon).

Figures (all prefixed `ccsup_`): slots{key,state} and cap{key} and waiting{key} (gauges, at
scrape); turns_ended_total{key,outcome} (outcomes of supervisor.history.OUTCOMES);
turn_wait_seconds{key} and turn_run_seconds{key} (histograms: queued to granted, started to
exited); cpu_seconds_total{key,mode} (user/system, from the exited event's usage figures when the
containment work provides them); guards_lost_total{key}; orphans_reaped_total{key};
bus_events_total{family} (events the supervisor published: turn, supervisor, slot); output_bytes_total{key,stream}
is not kept (it would cost a decode per chunk); start_time_seconds.

State: none on disk; the figures start from zero with each supervisor (Prometheus handles
counter resets), as `start_time_seconds` tells.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from .errors import ConfigError
from .history import outcome_of

log = logging.getLogger("ccsup.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
SLOT_STATES = ("free", "reserved", "held", "orphaned", "unreadable")
BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 1800, 3600, 7200, float("inf"))


class _SlotCollector(Collector):
    """cap, slots by state, and waiters per key, from a `ps` answer taken at scrape."""

    def __init__(self, ps: Callable[[], dict]):
        self._ps = ps

    def collect(self) -> Iterator[GaugeMetricFamily]:
        ps = self._ps()
        caps: dict[str, int] = {}
        states: dict[tuple[str, str], int] = {}
        waiting: dict[str, int] = {}
        for slot in ps.get("slots", []):
            key = slot.get("key")
            caps[key] = max(caps.get(key, 0), int(slot.get("cap") or 0))
            for state in SLOT_STATES:
                states.setdefault((key, state), 0)
            states[(key, slot.get("state"))] = states.get((key, slot.get("state")), 0) + 1
        for wait in ps.get("waits", []):
            if not wait.get("reservation"):
                waiting[wait["key"]] = waiting.get(wait["key"], 0) + 1
            else:
                waiting.setdefault(wait["key"], 0)
        for key in caps:
            waiting.setdefault(key, 0)
        cap = GaugeMetricFamily("ccsup_cap", "The cap of each key (slots).", labels=["key"])
        for key, value in sorted(caps.items()):
            cap.add_metric([key], value)
        slots = GaugeMetricFamily(
            "ccsup_slots", "Slots of each key by state.", labels=["key", "state"]
        )
        for (key, state), value in sorted(states.items()):
            slots.add_metric([key, state], value)
        waits = GaugeMetricFamily(
            "ccsup_waiting", "Turns and reservations waiting for a slot, by key.", labels=["key"]
        )
        for key, value in sorted(waiting.items()):
            waits.add_metric([key], value)
        yield from (cap, slots, waits)


class _Live:
    """What metrics keep of a turn until its terminal event."""

    __slots__ = ("key", "queued_at", "started_at", "exit", "stop_reason")

    def __init__(self, key: str):
        self.key = key
        self.queued_at: float | None = None
        self.started_at: float | None = None
        self.exit: dict | None = None
        self.stop_reason: str | None = None


class Metrics:
    def __init__(self, ps: Callable[[], dict], *, started_at: float | None = None):
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.turns_ended = Counter(
            "ccsup_turns_ended", "Turns ended, by key and outcome.", ["key", "outcome"], registry=r
        )
        self.wait_seconds = Histogram(
            "ccsup_turn_wait_seconds",
            "From queued to granted.",
            ["key"],
            buckets=BUCKETS,
            registry=r,
        )
        self.run_seconds = Histogram(
            "ccsup_turn_run_seconds",
            "From started to exited.",
            ["key"],
            buckets=BUCKETS,
            registry=r,
        )
        self.cpu_seconds = Counter(
            "ccsup_cpu_seconds", "CPU seconds used by turns, by key.", ["key", "mode"], registry=r
        )
        self.guards_lost = Counter(
            "ccsup_guards_lost", "Turns whose guard died without an outcome.", ["key"], registry=r
        )
        self.orphans_reaped = Counter(
            "ccsup_orphans_reaped", "Orphaned slots reaped, by key.", ["key"], registry=r
        )
        self.bus_events = Counter(
            "ccsup_bus_events",
            "Events the supervisor published, by family.",
            ["family"],
            registry=r,
        )
        start = Gauge("ccsup_start_time_seconds", "When this supervisor started.", registry=r)
        start.set(time.time() if started_at is None else started_at)
        r.register(_SlotCollector(ps))
        self._live: dict[str, _Live] = {}
        self._bus_children = {f: self.bus_events.labels(f) for f in ("turn", "supervisor", "slot")}

    # -- fed by every published event (on the event loop) -----------------------------------------

    def observe(self, topic: str, body: dict) -> None:
        family, _, rest = topic.partition(".")
        counter = self._bus_children.get(family)
        if counter is not None:
            counter.inc()
        if family == "turn":
            self._turn_event(rest, body)
        elif family == "slot" and rest.endswith(".reaped"):
            self.orphans_reaped.labels(str(body.get("key", rest.rpartition(".")[0]))).inc()

    def _turn_event(self, rest: str, body: dict) -> None:
        turn_id, _, kind = rest.rpartition(".")
        if kind in ("stdout", "stderr", "group", "truncated") or body.get("reservation") is True:
            return
        ts = float(body.get("ts") or time.time())
        live = self._live.get(turn_id)
        if live is None:
            live = self._live[turn_id] = _Live(str(body.get("key") or ""))
        if kind == "queued":
            live.queued_at = ts
        elif kind == "granted" and live.queued_at is not None:
            self.wait_seconds.labels(live.key).observe(max(0.0, ts - live.queued_at))
        elif kind == "started":
            live.started_at = ts
        elif kind == "stopping":
            live.stop_reason = body.get("reason")
        elif kind == "exited":
            live.exit = body
            if live.started_at is not None:
                self.run_seconds.labels(live.key).observe(max(0.0, ts - live.started_at))
            for mode in ("user", "system"):
                figure = body.get(f"cpu_{mode}_s")
                if isinstance(figure, (int, float)) and figure >= 0:
                    self.cpu_seconds.labels(live.key, mode).inc(figure)
            if body.get("reason") == "guard_lost":
                self.guards_lost.labels(live.key).inc()
        elif kind in ("released", "cancelled", "rejected"):
            del self._live[turn_id]
            stop = live.stop_reason or (body.get("reason") if kind != "released" else None)
            self.turns_ended.labels(live.key, outcome_of(kind, live.exit, stop)).inc()

    # -- reading ------------------------------------------------------------------------------------

    def exposition(self) -> bytes:
        """The text format, now (call on the event loop: the slot gauges read its state)."""
        return generate_latest(self.registry)


class MetricsServer:
    """`[metrics] listen`: GET /metrics over HTTP, answered with text made on the event loop."""

    def __init__(self, metrics: Metrics, host: str, port: int):
        self.metrics = metrics
        self.host, self.port = host, port
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        metrics = self.metrics

        async def text() -> bytes:
            return metrics.exposition()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 -- the http.server protocol
                if self.path.split("?", 1)[0] not in ("/metrics", "/"):
                    self.send_error(404, "only /metrics is here")
                    return
                try:
                    body = asyncio.run_coroutine_threadsafe(text(), loop).result(10)
                except Exception as e:  # noqa: BLE001 -- one failed scrape, never the listener
                    self.send_error(503, f"no figures: {type(e).__name__}")
                    return
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # a scrape every few seconds is not news

        try:
            self._httpd = ThreadingHTTPServer((self.host, self.port), Handler)
        except OSError as e:
            raise ConfigError(
                f"metrics.listen: unable to listen on {self.host}:{self.port}: {e.strerror}"
            ) from None
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="metrics", daemon=True
        )
        self._thread.start()
        log.info("metrics served on http://%s:%d/metrics", self.host, self.port)

    def close(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
