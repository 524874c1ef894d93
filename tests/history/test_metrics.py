"""Metrics (supervisor.history.metrics): the exposition parsed with prometheus_client's own parser.

Against a real supervisor: turns of known outcomes are run and the figures checked exactly;
the HTTP listener is checked on an ephemeral loopback port.
"""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from supervisor.config.metrics import metrics_address
from supervisor.errors import ConfigError
from supervisor.history.metrics import Metrics, MetricsServer
from supervisor.wire import protocol


def samples(text: str) -> dict[tuple, float]:
    """{(sample name, sorted label items): value} of an exposition."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def event(topic: str, ts: float, **fields) -> tuple[str, dict]:
    return topic, protocol.event_body({"key": "codex", **fields}, seq=1, ts=ts)


PS = {
    "slots": [
        {"key": "codex", "index": 0, "cap": 2, "state": "held"},
        {"key": "codex", "index": 1, "cap": 2, "state": "orphaned"},
        {"key": "solo", "index": 0, "cap": 1, "state": "reserved"},
    ],
    "waits": [
        {"id": "w1", "key": "codex", "reservation": False},
        {"id": "w2", "key": "codex", "reservation": False},
        {"id": "r1", "key": "solo", "reservation": True},
    ],
}


def test_figures_follow_the_published_events_and_the_slots():
    m = Metrics(ps=lambda: PS, started_at=1234.5)
    for topic, body in [
        event("turn.a.queued", 100.0),
        event("turn.a.granted", 102.0),
        event("turn.a.started", 102.5),
        event("turn.a.stdout", 103.0, offset=0, data="x"),
        event(
            "turn.a.exited",
            110.5,
            code=0,
            signal=None,
            reason=None,
            cpu_user_s=1.5,
            cpu_system_s=0.25,
        ),
        event("turn.a.gone", 111.0),
        event("turn.a.released", 111.0),
        event("turn.b.queued", 200.0),
        event("turn.b.cancelled", 201.0, reason="timeout"),
        event("turn.r.queued", 200.0, reservation=True),
        event("turn.c.queued", 300.0),
        event("turn.c.granted", 300.0),
        event("turn.c.started", 300.0),
        event("turn.c.exited", 301.0, code=None, signal=None, reason="guard_lost"),
        event("turn.c.released", 302.0),
        ("slot.codex.reaped", {"key": "codex", "index": 1}),
        ("supervisor.reloaded", {}),
    ]:
        m.observe(topic, body)
    got = samples(m.exposition().decode())
    k = (("key", "codex"),)
    assert got[("ccsup_turns_ended_total", k + (("outcome", "ok"),))] == 1
    assert got[("ccsup_turns_ended_total", k + (("outcome", "timeout"),))] == 1
    assert got[("ccsup_turns_ended_total", k + (("outcome", "guard_lost"),))] == 1
    assert (
        got[("ccsup_turn_wait_seconds_count", k)] == 2
        and got[("ccsup_turn_wait_seconds_sum", k)] == 2
    )
    assert got[("ccsup_turn_run_seconds_sum", k)] == 8 + 1
    assert got[("ccsup_turn_run_seconds_bucket", k + (("le", "5.0"),))] == 1
    assert got[("ccsup_cpu_seconds_total", k + (("mode", "user"),))] == 1.5
    assert got[("ccsup_cpu_seconds_total", k + (("mode", "system"),))] == 0.25
    assert got[("ccsup_guards_lost_total", k)] == 1
    assert got[("ccsup_orphans_reaped_total", k)] == 1
    assert got[("ccsup_bus_events_total", (("family", "turn"),))] == 15
    assert got[("ccsup_bus_events_total", (("family", "supervisor"),))] == 1
    assert got[("ccsup_start_time_seconds", ())] == 1234.5
    assert got[("ccsup_cap", k)] == 2 and got[("ccsup_cap", (("key", "solo"),))] == 1
    assert got[("ccsup_slots", k + (("state", "held"),))] == 1
    assert got[("ccsup_slots", k + (("state", "orphaned"),))] == 1
    assert got[("ccsup_slots", k + (("state", "free"),))] == 0
    assert got[("ccsup_slots", (("key", "solo"), ("state", "reserved")))] == 1
    assert got[("ccsup_waiting", k)] == 2 and got[("ccsup_waiting", (("key", "solo"),))] == 0
    assert m._live == {}  # nothing kept of ended turns


def test_the_text_is_what_prometheus_clients_own_counters_and_histograms_would_print(
    monkeypatch,
):
    """The figures are plain numbers until asked for: rendered, they are byte for byte what
    prometheus_client's Counter and Histogram print for the same observations (`_created` and
    order of children included), created at the same (frozen) time."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

    from supervisor.history.metrics import BUCKETS

    monkeypatch.setattr("time.time", lambda: 1700000000.25)
    m = Metrics(ps=lambda: PS, started_at=1234.5)
    r = CollectorRegistry()
    ended = Counter(
        "ccsup_turns_ended", "Turns ended, by key and outcome.", ["key", "outcome"], registry=r
    )
    adopted = Counter(
        "ccsup_turns_adopted",
        "Running turns taken over from a supervisor that was gone, by key.",
        ["key"],
        registry=r,
    )
    wait = Histogram(
        "ccsup_turn_wait_seconds", "From queued to granted.", ["key"], buckets=BUCKETS, registry=r
    )
    run = Histogram(
        "ccsup_turn_run_seconds", "From started to exited.", ["key"], buckets=BUCKETS, registry=r
    )
    cpu = Counter(
        "ccsup_cpu_seconds", "CPU seconds used by turns, by key.", ["key", "mode"], registry=r
    )
    lost = Counter(
        "ccsup_guards_lost", "Turns whose guard died without an outcome.", ["key"], registry=r
    )
    reaped = Counter("ccsup_orphans_reaped", "Orphaned slots reaped, by key.", ["key"], registry=r)
    bus = Counter(
        "ccsup_bus_events", "Events the supervisor published, by family.", ["family"], registry=r
    )
    for family in ("turn", "supervisor", "slot"):
        bus.labels(family)
    periodic = Counter(
        "ccsup_periodic_errors",
        "Exceptions raised by the supervisor's periodic duties, by duty.",
        ["task"],
        registry=r,
    )
    Gauge("ccsup_start_time_seconds", "When this supervisor started.", registry=r).set(1234.5)

    for topic, body in [
        event("turn.a.queued", 100.0),
        event("turn.a.granted", 102.0),
        event("turn.a.started", 102.5),
        event(
            "turn.a.exited",
            110.5,
            code=0,
            signal=None,
            reason=None,
            cpu_user_s=2,
            cpu_system_s=0.25,
        ),
        event("turn.a.released", 111.0),
        ("turn.b.queued", {"key": "other", "ts": 5.0}),
        ("turn.b.granted", {"key": "other", "ts": 5000.0}),
        event("turn.c.started", 200.0),
        event("turn.c.exited", 201.0, code=None, signal=None, reason="guard_lost"),
        event("turn.c.released", 202.0),
        event("turn.d.adopted", 300.0, index=0, guard={"pid": 5, "start": 6}, gap_s=1.5),
        ("slot.codex.reaped", {"key": "codex", "index": 1}),
    ]:
        m.observe(topic, body)
    wait.labels("codex").observe(2.0)
    wait.labels("other").observe(4995.0)
    run.labels("codex").observe(8.0)
    run.labels("codex").observe(1.0)
    cpu.labels("codex", "user").inc(2)
    cpu.labels("codex", "system").inc(0.25)
    ended.labels("codex", "ok").inc()
    lost.labels("codex").inc()
    ended.labels("codex", "guard_lost").inc()
    reaped.labels("codex").inc()
    adopted.labels("codex").inc()
    bus.labels("turn").inc(11)
    bus.labels("slot").inc()
    m.periodic_errors.inc(("grant",), 0)
    m.periodic_errors.inc(("reap",))
    periodic.labels("grant")
    periodic.labels("reap").inc()
    ours = m.exposition().decode()
    theirs = generate_latest(r).decode()
    assert ours.startswith(theirs)  # then the slot gauges, read at scrape
    assert ours[len(theirs) :].startswith("# HELP ccsup_cap ")


@pytest.mark.parametrize(
    "text, address",
    [
        ("127.0.0.1:9464", ("127.0.0.1", 9464)),
        ("[::1]:80", ("::1", 80)),
        ("9464", ("127.0.0.1", 9464)),
    ],
)
def test_metrics_address(text, address):
    assert metrics_address(text) == address


@pytest.mark.parametrize("text", ["", "host:", ":80", "h:99999", "h:x"])
def test_metrics_address_refuses_what_is_not_an_address(text):
    with pytest.raises(ConfigError, match="metrics.listen"):
        metrics_address(text)


def test_the_listener_serves_the_exposition_made_on_the_loop():
    async def main():
        m = Metrics(ps=lambda: PS)
        server = MetricsServer(m, "127.0.0.1", 0)
        server.start()
        try:

            def fetch(path):
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{server.port}{path}", timeout=5
                ) as r:
                    return r.headers["Content-Type"], r.read().decode()

            kind, text = await asyncio.to_thread(fetch, "/metrics")
            assert kind.startswith("text/plain") and ("ccsup_cap", (("key", "codex"),)) in samples(
                text
            )
            with pytest.raises(urllib.error.HTTPError) as err:
                await asyncio.to_thread(fetch, "/other")
            assert err.value.code == 404
        finally:
            server.close()

    asyncio.run(main())


@pytest.mark.timeout(60)
def test_a_real_supervisor_counts_the_turns_it_ran(daemon):
    d = daemon(caps="codex = 1")
    with d.client() as client:
        list(client.run_turn("codex", ["true"], id="fine"))
        list(client.run_turn("codex", ["sh", "-c", "exit 4"], id="four"))
        with client.subscribe(["turn.long."]) as sub:
            client.turn("codex", ["sleep", "30"], id="long")
            for topic, _ in sub.until_terminal(idle_check=client.check_running):
                if topic.endswith(".started"):
                    client.turn("codex", ["true"], id="waiting")
                    got = samples(client.call("metrics")["text"])
                    assert got[("ccsup_waiting", (("key", "codex"),))] == 1
                    assert got[("ccsup_slots", (("key", "codex"), ("state", "held")))] == 1
                    client.cancel("waiting")
                    client.cancel("long")
        got = samples(client.call("metrics")["text"])
    k = (("key", "codex"),)
    for outcome, count in (("ok", 1), ("exit", 1), ("cancelled", 2)):
        assert got[("ccsup_turns_ended_total", k + (("outcome", outcome),))] == count
    assert got[("ccsup_turn_run_seconds_count", k)] == 3
    assert got[("ccsup_turn_wait_seconds_count", k)] == 3  # the cancelled waiter was never granted
    assert got[("ccsup_slots", k + (("state", "free"),))] == 1
    assert got[("ccsup_waiting", k)] == 0


def test_ccsup_metrics_prints_the_exposition_and_needs_a_supervisor(daemon, state_dir):
    import subprocess
    import sys

    command = [sys.executable, "-m", "supervisor", "--state-dir", str(state_dir), "metrics"]
    d = daemon(caps="codex = 1")
    with d.client() as client:
        list(client.run_turn("codex", ["true"], id="one"))
    shown = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert shown.returncode == 0, shown.stderr
    got = samples(shown.stdout)
    assert got[("ccsup_turns_ended_total", (("key", "codex"), ("outcome", "ok")))] == 1
    d.stop()
    gone = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert gone.returncode == 3 and "no supervisor is running" in gone.stderr


def test_the_grafana_dashboard_asks_only_for_figures_the_supervisor_exposes():
    import json
    import re
    from pathlib import Path

    dashboard = Path(__file__).resolve().parents[2] / "contrib" / "grafana" / "ccsup-dashboard.json"
    text = dashboard.read_text()
    json.loads(text)
    m = Metrics(ps=lambda: PS)
    for topic, body in [
        event("turn.a.queued", 1.0),
        event("turn.a.granted", 2.0),
        event("turn.a.started", 2.0),
        event("turn.a.exited", 3.0, code=None, signal=None, reason="guard_lost", cpu_user_s=1.0),
        event("turn.a.released", 3.0),
        event("turn.b.adopted", 4.0, index=0, gap_s=1.0),
        ("slot.codex.reaped", {"key": "codex"}),
    ]:
        m.observe(topic, body)
    exposed = {name for name, _ in samples(m.exposition().decode())}
    asked = set(re.findall(r"ccsup_[a-z_]+", text)) - {"ccsup_keys"}
    assert asked and asked <= exposed, asked - exposed
    assert {"ccsup_waiting", "ccsup_slots"} <= asked  # waits and holders per key over time


@pytest.mark.timeout(60)
def test_metrics_listen_serves_the_figures_of_a_real_supervisor(daemon):
    import socket

    with socket.socket() as probe:  # a free loopback port for the supervisor to take
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    d = daemon(caps="codex = 1", extra=f'[metrics]\nlisten = "127.0.0.1:{port}"\n')
    with d.client() as client:
        list(client.run_turn("codex", ["sh", "-c", "exit 2"], id="two"))
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        got = samples(reply.read().decode())
    k = (("key", "codex"),)
    assert got[("ccsup_turns_ended_total", k + (("outcome", "exit"),))] == 1
    assert got[("ccsup_cap", k)] == 1 and got[("ccsup_slots", k + (("state", "free"),))] == 1
    assert got[("ccsup_start_time_seconds", ())] > 0
