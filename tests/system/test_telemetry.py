"""Turns tagged for OpenTelemetry: every turn's environment carries `OTEL_RESOURCE_ATTRIBUTES` with
its turn id, key, session and agent, after the caller's own attributes and never replacing one."""

from __future__ import annotations

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
