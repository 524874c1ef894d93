"""Turns tagged for OpenTelemetry: every turn's environment carries `OTEL_RESOURCE_ATTRIBUTES` with
its turn id, key, session and agent, after the caller's own attributes and never replacing one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from urllib.parse import unquote

import pytest

from supervisor.turns import telemetry

CCSUP = [sys.executable, "-m", "supervisor"]


@pytest.fixture
def env(daemon, state_dir):
    d = daemon(caps="codex = 2, default = 2")
    environment = dict(os.environ, CCSUP_STATE_DIR=str(state_dir), CCSUP_CONFIG=str(d.config))
    environment.pop("CCSUP_KEY", None)
    environment.pop(telemetry.VARIABLE, None)
    return environment


def turn_env(env: dict[str, str], *args: str) -> dict[str, str]:
    done = subprocess.run(
        [*CCSUP, "run", "--quiet", *args, "--", "env", "-0"],
        env=env,
        capture_output=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    pairs = [entry.split("=", 1) for entry in done.stdout.decode().split("\0") if "=" in entry]
    return dict(pairs)


def attributes(value: str) -> list[tuple[str, str]]:
    return [(k, unquote(v)) for k, v in (entry.split("=", 1) for entry in value.split(","))]


def test_a_turn_carries_its_four_attributes_after_the_callers_own(env):
    caller = {**env, telemetry.VARIABLE: "service.name=my-tool,deployment.environment=ci"}
    seen = turn_env(caller, "--key", "codex", "--session", 's 1,x;"ü%', "--agent", "reviewer")
    assert seen[telemetry.VARIABLE].startswith("service.name=my-tool,deployment.environment=ci,")
    assert attributes(seen[telemetry.VARIABLE]) == [
        ("service.name", "my-tool"),
        ("deployment.environment", "ci"),
        ("ccsup.turn.id", seen["CCSUP_TURN"]),
        ("ccsup.key", "codex"),
        ("ccsup.session", 's 1,x;"ü%'),
        ("ccsup.agent", "reviewer"),
    ]
    # percent-encoded as the specification asks: no separator, space or quote left bare
    assert "ccsup.session=s%201%2Cx%3B%22%C3%BC%25" in seen[telemetry.VARIABLE]


def test_a_key_the_caller_set_is_never_replaced(env):
    caller = {**env, telemetry.VARIABLE: " ccsup.session = mine ,team=a"}
    seen = turn_env(caller, "--session", "s1", "--agent", "coder")
    assert attributes(seen[telemetry.VARIABLE])[:2] == [
        (" ccsup.session ", " mine "),
        ("team", "a"),
    ]
    keys = [k.strip() for k, _ in attributes(seen[telemetry.VARIABLE])]
    assert keys == ["ccsup.session", "team", "ccsup.turn.id", "ccsup.key", "ccsup.agent"]


def test_without_the_callers_own_and_in_the_supervisors_environment(env):
    seen = turn_env(env, "--session", "s1")  # no agent: its attribute is left out, not empty
    assert attributes(seen[telemetry.VARIABLE]) == [
        ("ccsup.turn.id", seen["CCSUP_TURN"]),
        ("ccsup.key", "default"),
        ("ccsup.session", "s1"),
    ]
    clean = turn_env({**env, telemetry.VARIABLE: "service.name=x"}, "--clean-env", "--agent", "a")
    assert [k for k, _ in attributes(clean[telemetry.VARIABLE])] == [
        "ccsup.turn.id",
        "ccsup.key",
        "ccsup.agent",
    ]
    named = turn_env({**env, telemetry.VARIABLE: "a=1"}, "--clean-env", "--env", telemetry.VARIABLE)
    assert named[telemetry.VARIABLE].startswith("a=1,ccsup.turn.id=")


@pytest.mark.parametrize(
    ("own", "expected"),
    [
        (None, "ccsup.turn.id=t,ccsup.key=k"),
        ("", "ccsup.turn.id=t,ccsup.key=k"),
        ("x=1,", "x=1,ccsup.turn.id=t,ccsup.key=k"),
        ("ccsup.key=mine", "ccsup.key=mine,ccsup.turn.id=t"),
        ("garbage", "garbage,ccsup.turn.id=t,ccsup.key=k"),
    ],
)
def test_merged(own, expected):
    assert telemetry.merged(own, telemetry.turn_attributes("t", "k", None, None)) == expected


class _Receiver:
    """A local OTLP/HTTP receiver: every POST's JSON body, by path."""

    def __init__(self):
        import http.server
        import threading

        self.posts: list[tuple[str, dict]] = []
        self.cond = threading.Condition()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with outer.cond:
                    outer.posts.append((self.path, json.loads(body)))
                    outer.cond.notify_all()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args):
                pass

        self.server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def spans(self) -> list[dict]:
        with self.cond:
            return [
                span
                for path, body in self.posts
                if path == "/v1/traces"
                for rs in body["resourceSpans"]
                for ss in rs["scopeSpans"]
                for span in ss["spans"]
            ]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_with_an_otel_endpoint_one_span_per_turn_arrives(daemon, state_dir):
    receiver = _Receiver()
    try:
        d = daemon(start=False, caps="codex = 1")
        d.config.write_text(d.config.read_text() + f'\n[otel]\nendpoint = "{receiver.url}"\n')
        d.start()
        environment = dict(os.environ, CCSUP_STATE_DIR=str(state_dir), CCSUP_CONFIG=str(d.config))
        ran = []
        for code in (0, 3):
            done = subprocess.run(
                [
                    *CCSUP,
                    "run",
                    "--quiet",
                    "--key",
                    "codex",
                    "--session",
                    "s1",
                    "--agent",
                    "a",
                    "--",
                    "sh",
                    "-c",
                    f"echo $CCSUP_TURN; exit {code}",
                ],
                env=environment,
                capture_output=True,
                text=True,
                timeout=30,
                stdin=subprocess.DEVNULL,
            )
            assert done.returncode == code, done.stderr
            ran.append(done.stdout.strip())
        from conftest import wait_until

        wait_until(lambda: len(receiver.spans()) >= 2, 20, 0.05, "two spans at the receiver")
        spans = receiver.spans()
        assert len(spans) == 2
        by_turn = {}
        for span in spans:
            attrs = {a["key"]: next(iter(a["value"].values())) for a in span["attributes"]}
            by_turn[attrs["ccsup.turn.id"]] = (span, attrs)
        assert set(by_turn) == set(ran)
        ok, attrs = by_turn[ran[0]]
        assert ok["name"] == "ccsup.turn" and ok["status"]["code"] == 1
        assert (attrs["ccsup.key"], attrs["ccsup.session"], attrs["ccsup.agent"]) == (
            "codex",
            "s1",
            "a",
        )
        assert [e["name"] for e in ok["events"]] == ["waiting", "running"]
        assert int(ok["startTimeUnixNano"]) < int(ok["endTimeUnixNano"])
        failed, attrs = by_turn[ran[1]]
        assert failed["status"]["code"] == 2 and attrs["ccsup.exit_code"] == "3"
    finally:
        receiver.close()


def test_a_collector_that_is_down_costs_the_spans_not_the_turns():
    import socket

    from supervisor.daemon.otel import SpanExporter

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    exporter = SpanExporter(url)
    for kind in ("queued", "granted", "started", "exited", "gone", "released"):
        exporter.observe(f"turn.t1.{kind}", {"id": "t1", "key": "k", "ts": 1.0, "code": 0})
    exporter.observe("turn.r1.queued", {"id": "r1", "key": "k", "reservation": True})
    exporter.close(timeout=10)
    assert (exporter.sent, exporter.dropped) == (0, 1)
    assert exporter.turns == {}  # the ended turn is forgotten; a reservation never kept


@pytest.mark.parametrize("endpoint", ['"ftp://x"', '"127.0.0.1:4318"', "4318"])
def test_a_bad_otel_endpoint_is_named(endpoint):
    from supervisor import config

    with pytest.raises(config.ConfigProblems) as e:
        config.parse(f"[otel]\nendpoint = {endpoint}\n", "c.toml")
    assert "otel.endpoint" in str(e.value)
