"""The supervisor's figures in the Prometheus exposition format (prometheus_client).

Design note. Like the history, the counters and histograms are fed by the events the supervisor
publishes (`Metrics.observe`, one dict lookup and a few additions per lifecycle event; output
events cost one startswith), so they say exactly what the bus said. The gauges of slots and
waiters are read when the text is asked for, from the same `ps` answer the CLI shows, on the
event loop: `exposition()` runs there (the control command `metrics`), and the HTTP listener's
thread hands each request to the loop (`run_coroutine_threadsafe`) instead of reading the
supervisor's state from another thread. The figures are this object's own, never in
prometheus_client's global registry (two supervisors in one test process must not share them).

The figures are plain numbers here (`_Counter`, `_Histogram`), rendered as the prometheus_client
families they stand for (same names, samples, `_created` times and order) only when the text is
asked for: prometheus_client (with http.server, urllib.request and email, which it imports) is
imported then, and http.server only with `[metrics] listen`. Holding its Counter and Histogram
objects from the start made every supervisor import them, about 3.5 MiB of its RSS, for a
command most never run.

Rejected: prometheus_client's `start_http_server`, whose collectors would run in its thread;
pushing to a gateway (a scrape is what Prometheus expects of a daemon).

Figures (all prefixed `ccsup_`): slots{key,state} and cap{key} and waiting{key} (gauges, at
scrape); quota_used_ratio{key,window} and quota_resets_at_seconds{key,window} (gauges, at
scrape, from ps's `keys`); turns_ended_total{key,outcome} (outcomes of supervisor.history.db.OUTCOMES);
turn_wait_seconds{key} and turn_run_seconds{key} (histograms: queued to granted, started to
exited); turns_adopted_total{key} (running turns a supervisor took over from one that was gone:
`turn.<id>.adopted`); cpu_seconds_total{key,mode} (user/system, from the exited event's usage
figures when the containment work provides them); guards_lost_total{key}; orphans_reaped_total{key};
bus_events_total{family} (events the supervisor published: turn, supervisor, slot);
periodic_errors_total{task} (exceptions a periodic duty raised and survived: expire_finished,
save_state, grant, confirm_ends, reap, prune_logs, trim_memory; see supervisor.daemon.main); output_bytes_total{key,stream}
is not kept (it would cost a decode per chunk); start_time_seconds; memory_budget_bytes,
memory_predicted_bytes, memory_pressure_avg10 (a share), memory_prediction_bytes{key} and
turn_peak_memory_bytes{key} ([memory], supervisor.admission.room: at scrape).

State: none on disk; the figures start from zero with each supervisor (Prometheus handles
counter resets), as `start_time_seconds` tells.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ..caps import SlotState
from ..errors import ConfigError
from .db import outcome_of

log = logging.getLogger("ccsup.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 1800, 3600, 7200, float("inf"))

if TYPE_CHECKING:
    from http.server import ThreadingHTTPServer

    from prometheus_client.metrics_core import Metric


class _Counter:
    """A labelled counter: each child's value and creation time, in the order first counted."""

    def __init__(self, name: str, doc: str, labelnames: tuple[str, ...]):
        self.name, self.doc, self.labelnames = name, doc, labelnames
        self.children: dict[tuple[str, ...], list[float]] = {}  # labels -> [value, created]

    def inc(self, labels: tuple[str, ...], amount: float = 1.0) -> None:
        child = self.children.get(labels)
        if child is None:
            child = self.children[labels] = [0.0, time.time()]
        child[0] += amount

    def family(self, use_created: bool) -> Metric:
        """As prometheus_client's Counter collects: `_total`, then `_created`, per child."""
        from prometheus_client.metrics_core import Metric

        family = Metric(self.name, self.doc, "counter")
        for labels, (value, created) in self.children.items():
            names = dict(zip(self.labelnames, labels, strict=True))
            family.add_sample(f"{self.name}_total", names, value)
            if use_created:
                family.add_sample(f"{self.name}_created", dict(names), created)
        return family


class _Histogram:
    """A histogram by one label: each child's bucket counts, sum and creation time."""

    def __init__(self, name: str, doc: str, labelname: str):
        self.name, self.doc, self.labelname = name, doc, labelname
        # label -> (bucket counts, [sum, created])
        self.children: dict[str, tuple[list[float], list[float]]] = {}

    def observe(self, label: str, amount: float) -> None:
        child = self.children.get(label)
        if child is None:
            child = self.children[label] = ([0.0] * len(BUCKETS), [0.0, time.time()])
        buckets, total = child
        total[0] += amount
        for i, bound in enumerate(BUCKETS):
            if amount <= bound:
                buckets[i] += 1
                break

    def family(self, use_created: bool) -> Metric:
        """As prometheus_client's Histogram collects: cumulative buckets, count, sum, created."""
        from prometheus_client.metrics_core import Metric
        from prometheus_client.utils import floatToGoString

        family = Metric(self.name, self.doc, "histogram")
        for label, (buckets, (total, created)) in self.children.items():
            names = {self.labelname: label}
            acc = 0.0
            for bound, count in zip(BUCKETS, buckets, strict=True):
                acc += count
                family.add_sample(
                    f"{self.name}_bucket", {**names, "le": floatToGoString(bound)}, acc
                )
            family.add_sample(f"{self.name}_count", dict(names), acc)
            family.add_sample(f"{self.name}_sum", dict(names), total)
            if use_created:
                family.add_sample(f"{self.name}_created", dict(names), created)
        return family


class _Collected:
    """What prometheus_client's generate_latest reads: the families, in order."""

    def __init__(self, families: Callable[[], Iterator[Metric]]):
        self.collect = families


def _slot_families(ps: dict) -> Iterator[Metric]:
    """cap, slots by state, and waiters per key, from a `ps` answer taken at scrape."""
    from prometheus_client.core import GaugeMetricFamily

    caps: dict[str, int] = {}
    states: dict[tuple[str, str], int] = {}
    waiting: dict[str, int] = {}
    for tally in ps.get("slot_keys", []):  # each key's slots counted by state, free ones too
        key = tally.get("key")
        caps[key] = int(tally.get("cap") or 0)
        for named in SlotState:
            states[(key, named)] = int(tally.get(named) or 0)
    tallied = set(caps)
    for slot in ps.get("slots", []):  # a key without a tally (a `ps` of the older shape)
        key = slot.get("key")
        if key in tallied:
            continue
        caps[key] = max(caps.get(key, 0), int(slot.get("cap") or 0))
        for named in SlotState:
            states.setdefault((key, named), 0)
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
    slots = GaugeMetricFamily("ccsup_slots", "Slots of each key by state.", labels=["key", "state"])
    for (key, state), value in sorted(states.items()):
        slots.add_metric([key, state], value)
    waits = GaugeMetricFamily(
        "ccsup_waiting", "Turns and reservations waiting for a slot, by key.", labels=["key"]
    )
    for key, value in sorted(waiting.items()):
        waits.add_metric([key], value)
    yield from (cap, slots, waits)
    used = GaugeMetricFamily(
        "ccsup_quota_used_ratio",
        "The used fraction (0-1) of each provider window of a key not yet reset.",
        labels=["key", "window"],
    )
    resets = GaugeMetricFamily(
        "ccsup_quota_resets_at_seconds",
        "When each provider window of a key resets (epoch seconds).",
        labels=["key", "window"],
    )
    for entry in ps.get("keys", []):
        for window in entry.get("quota") or []:
            used.add_metric([entry["key"], window["window"]], window["used"])
            resets.add_metric([entry["key"], window["window"]], window["resets_at"])
    yield from (used, resets)


class _Live:
    """What metrics keep of a turn until its terminal event."""

    __slots__ = ("key", "queued_at", "started_at", "exit", "stop_reason")

    def __init__(self, key: str):
        self.key = key
        self.queued_at: float | None = None
        self.started_at: float | None = None
        self.exit: dict | None = None
        self.stop_reason: str | None = None


def _memory_families(view: dict | None, last_peak: dict[str, int]) -> Iterator[Metric]:
    """[memory] (supervisor.admission.room): the budget, what running turns are predicted to
    use, PSI's `some avg10` share, each key's prediction and its last turn's peak."""
    from prometheus_client.core import GaugeMetricFamily

    peaks = GaugeMetricFamily(
        "ccsup_turn_peak_memory_bytes",
        "The whole tree's peak memory of the key's last exited turn.",
        labels=["key"],
    )
    for key, peak in sorted(last_peak.items()):
        peaks.add_metric([key], peak)
    yield peaks
    if view is None:
        return
    if view.get("budget_bytes") is not None:
        yield GaugeMetricFamily(
            "ccsup_memory_budget_bytes",
            "The [memory] budget (with auto: MemAvailable now less reserve).",
            value=view["budget_bytes"],
        )
    yield GaugeMetricFamily(
        "ccsup_memory_predicted_bytes",
        "What the running turns are predicted to use (each: its prediction or its use now).",
        value=view.get("predicted") or 0,
    )
    if view.get("avg10") is not None:
        yield GaugeMetricFamily(
            "ccsup_memory_pressure_avg10",
            "PSI memory `some avg10`, as a share (0-1).",
            value=view["avg10"],
        )
    predictions = GaugeMetricFamily(
        "ccsup_memory_prediction_bytes", "Each key's predicted peak memory.", labels=["key"]
    )
    for key, entry in (view.get("keys") or {}).items():
        if entry.get("prediction") is not None:
            predictions.add_metric([key], entry["prediction"])
    yield predictions


class Metrics:
    def __init__(
        self,
        ps: Callable[[], dict],
        *,
        started_at: float | None = None,
        memory: Callable[[], dict] | None = None,
    ):
        self._ps = ps
        self._memory = memory  # supervisor.admission.room's view, read at scrape
        self.started_at = time.time() if started_at is None else started_at
        self.turns_ended = _Counter(
            "ccsup_turns_ended", "Turns ended, by key and outcome.", ("key", "outcome")
        )
        self.wait_seconds = _Histogram("ccsup_turn_wait_seconds", "From queued to granted.", "key")
        self.run_seconds = _Histogram("ccsup_turn_run_seconds", "From started to exited.", "key")
        self.cpu_seconds = _Counter(
            "ccsup_cpu_seconds", "CPU seconds used by turns, by key.", ("key", "mode")
        )
        self.turns_adopted = _Counter(
            "ccsup_turns_adopted",
            "Running turns taken over from a supervisor that was gone, by key.",
            ("key",),
        )
        self.guards_lost = _Counter(
            "ccsup_guards_lost", "Turns whose guard died without an outcome.", ("key",)
        )
        self.orphans_reaped = _Counter(
            "ccsup_orphans_reaped", "Orphaned slots reaped, by key.", ("key",)
        )
        self.bus_events = _Counter(
            "ccsup_bus_events", "Events the supervisor published, by family.", ("family",)
        )
        for family in ("turn", "supervisor", "slot"):
            self.bus_events.inc((family,), 0)
        # Fed by the daemon (supervisor.daemon.main.run_duty), which names each duty at 0 first.
        self.periodic_errors = _Counter(
            "ccsup_periodic_errors",
            "Exceptions raised by the supervisor's periodic duties, by duty.",
            ("task",),
        )
        self._live: dict[str, _Live] = {}
        self.last_peak: dict[str, int] = {}  # key -> the whole-tree peak of its last exited turn

    # -- fed by every published event (on the event loop) -----------------------------------------

    def observe(self, topic: str, body: dict) -> None:
        family, _, rest = topic.partition(".")
        counted = self.bus_events.children.get((family,))
        if counted is not None:
            counted[0] += 1
        if family == "turn":
            self._turn_event(rest, body)
        elif family == "slot" and rest.endswith(".reaped"):
            self.orphans_reaped.inc((str(body.get("key", rest.rpartition(".")[0])),))

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
            self.wait_seconds.observe(live.key, max(0.0, ts - live.queued_at))
        elif kind == "started":
            live.started_at = ts
        elif kind == "adopted":  # its queued and started events were the old supervisor's
            self.turns_adopted.inc((live.key,))
            started = body.get("started_at")  # so its run time is counted when it exits
            if live.started_at is None and isinstance(started, (int, float)):
                live.started_at = float(started)
        elif kind == "stopping":
            live.stop_reason = body.get("reason")
        elif kind == "exited":
            live.exit = body
            if live.started_at is not None:
                self.run_seconds.observe(live.key, max(0.0, ts - live.started_at))
            for mode in ("user", "system"):
                figure = body.get(f"cpu_{mode}_s")
                if isinstance(figure, (int, float)) and figure >= 0:
                    self.cpu_seconds.inc((live.key, mode), figure)
            peak = body.get("peak_mem")
            if isinstance(peak, int) and peak > 0:
                self.last_peak[live.key] = peak
            if body.get("reason") == "guard_lost":
                self.guards_lost.inc((live.key,))
        elif kind in ("released", "cancelled", "rejected"):
            del self._live[turn_id]
            stop = live.stop_reason or (body.get("reason") if kind != "released" else None)
            self.turns_ended.inc((live.key, outcome_of(kind, live.exit, stop)))

    # -- reading ------------------------------------------------------------------------------------

    def exposition(self) -> bytes:
        """The text format, now (call on the event loop: the slot gauges read its state)."""
        from prometheus_client import generate_latest
        from prometheus_client import metrics as client_metrics
        from prometheus_client.core import GaugeMetricFamily

        # Whether its own Counter would add `_created` (PROMETHEUS_DISABLE_CREATED_SERIES or
        # disable_created_metrics()): the switch its families read.
        use_created = client_metrics._use_created

        def families() -> Iterator[Metric]:
            yield self.turns_ended.family(use_created)
            yield self.turns_adopted.family(use_created)
            yield self.wait_seconds.family(use_created)
            yield self.run_seconds.family(use_created)
            yield self.cpu_seconds.family(use_created)
            yield self.guards_lost.family(use_created)
            yield self.orphans_reaped.family(use_created)
            yield self.bus_events.family(use_created)
            yield self.periodic_errors.family(use_created)
            yield GaugeMetricFamily(
                "ccsup_start_time_seconds", "When this supervisor started.", value=self.started_at
            )
            yield from _slot_families(self._ps())
            yield from _memory_families(self._memory() if self._memory else None, self.last_peak)

        return generate_latest(_Collected(families))


class MetricsServer:
    """`[metrics] listen`: GET /metrics over HTTP, answered with text made on the event loop."""

    def __init__(self, metrics: Metrics, host: str, port: int):
        self.metrics = metrics
        self.host, self.port = host, port
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

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
