"""A waiting `ccsup run` on a terminal keeps one line current: position,
why and since when, rewritten in place as the seconds go by, ended once the turn starts. In a
real terminal (tmux); off a terminal, run's plain lines are unchanged (tests/system/test_run.py)."""

from __future__ import annotations

import os
import re
import shutil

import pytest
from cli_daemon import CCSUP, ccsup, cli_daemon_fixture  # noqa: F401 (the cli_daemon fixture)
from conftest import wait_until
from tmux_pane import Pane

from supervisor.client import Client

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


def test_a_waiting_run_keeps_one_line_current_until_it_starts(cli_daemon, tmp_path):
    state_dir = cli_daemon("[slots]\ncaps = { t = 1 }\n")
    go = tmp_path / "go"
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    env |= {"CCSUP_STATE_DIR": str(state_dir), "CCSUP_CONFIG": str(state_dir / "ccsup.toml")}
    with Client(state_dir) as client:  # no requester to watch: it holds the slot until `go`
        client.turn("t", ["sh", "-c", f"while [ ! -e {go} ]; do sleep 0.05; done"], id="holder")
    wait_until(
        lambda: '"held"' in ccsup("ps", "--json", state_dir=state_dir).stdout, what="a held slot"
    )
    pane = Pane(
        f"ccsup-wait-{os.getpid()}",
        f"{CCSUP[0]} -m supervisor run --key t -- echo done; sleep 60",
        env,
        width=120,
    )
    line = re.compile(
        r"ccsup: turn [0-9a-f]{8}: waiting for a slot of t: position 1, key_full, "
        r"since \d\d:\d\d:\d\d \((\d+)s\)"
    )

    def waiting_lines() -> list[re.Match]:
        return [m for m in map(line.match, pane.screen().splitlines()) if m]

    try:
        wait_until(lambda: waiting_lines(), what="the waiting line")
        wait_until(lambda: int(waiting_lines()[-1].group(1)) >= 2, what="the line counting on")
        assert len(waiting_lines()) == 1  # rewritten in place, not a line a second
        go.touch()
        wait_until(lambda: "done" in pane.screen().splitlines(), what="the turn's output")
        screen = pane.screen().splitlines()
        assert len(waiting_lines()) == 1
        started = next(i for i, x in enumerate(screen) if x.endswith(": started"))
        assert line.match(screen[started - 1])  # the waiting line was ended, then started said
    finally:
        go.touch()
        pane.close()


def test_a_background_run_never_rewrites_the_line_the_user_types_on(cli_daemon, tmp_path):
    """`ccsup run ... &` in an interactive shell (job control: the job has its own process group,
    not the terminal's foreground one) says it waits once, in plain lines, and never redraws
    a live line over the prompt or what is typed after it."""
    state_dir = cli_daemon("[slots]\ncaps = { t = 1 }\n")
    go = tmp_path / "go"
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    env |= {"CCSUP_STATE_DIR": str(state_dir), "CCSUP_CONFIG": str(state_dir / "ccsup.toml")}
    env |= {"HISTFILE": "/dev/null"}
    with Client(state_dir) as client:  # no requester to watch: it holds the slot until `go`
        client.turn("t", ["sh", "-c", f"while [ ! -e {go} ]; do sleep 0.05; done"], id="holder")
    wait_until(
        lambda: '"held"' in ccsup("ps", "--json", state_dir=state_dir).stdout, what="a held slot"
    )
    pane = Pane(
        f"ccsup-bg-{os.getpid()}", "env PS1='$ ' bash --norc --noprofile -i", env, width=160
    )
    try:
        wait_until(lambda: pane.screen().rstrip().endswith("$"), timeout=30, what="the prompt")
        pane.keys(f"{CCSUP[0]} -m supervisor run --key t -- echo done &", "Enter")
        try:
            wait_until(lambda: "waiting for a slot of t" in pane.screen(), timeout=30)
        except TimeoutError:
            raise AssertionError(
                f"no waiting notice in 30 s; the screen:\n{pane.screen()}"
            ) from None
        pane.keys("echo typed-", "Enter")
        wait_until(lambda: "typed-" in pane.screen().split("echo typed-")[-1], what="the echo")
        # Three seconds of waiting: a live line would have redrawn itself (a second each).
        wait_until(lambda: _waited(state_dir) >= 3, what="3 s of waiting")
        screen = pane.screen()
        assert "since" not in screen  # no live line: plain ones
        assert screen.count("waiting for a slot of t") == 1
        assert any(line.rstrip() == "typed-" for line in screen.splitlines())
        go.touch()
        wait_until(lambda: "done" in pane.screen().splitlines(), what="the turn's output")
    finally:
        go.touch()
        pane.close()


def _waited(state_dir) -> float:
    import json
    import time

    waits = json.loads(ccsup("ps", "--json", state_dir=state_dir).stdout)["waits"]
    return max((time.time() - w["since"] for w in waits), default=0.0)
