"""`ccsup top`, driven in tmux at 80x24 as a user would: it shows a new waiter
without a key press (the bus drives it), cancels the selected waiter with `c` and `y`, and quits
with `q`. The screen is read with `tmux capture-pane`; every wait is for what the screen or the
supervisor shows, never a fixed sleep."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest
from cli_daemon import CCSUP, ccsup, cli_daemon_fixture  # noqa: F401 (the cli_daemon fixture)
from conftest import wait_until
from tmux_pane import Pane

from supervisor.cli.views.top import Model, render

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


def test_top_shows_a_new_waiter_without_a_key_press_and_cancels_it_with_c(cli_daemon, tmp_path):
    state_dir = cli_daemon("[slots]\ncaps = { t = 1 }\n")
    go = tmp_path / "go"
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    env |= {"CCSUP_STATE_DIR": str(state_dir), "TERM": "xterm-256color"}
    env["CCSUP_CONFIG"] = str(state_dir / "ccsup.toml")
    holder = subprocess.Popen(
        [*CCSUP, "run", "--key", "t", "--", "sh", "-c", f"while [ ! -e {go} ]; do sleep 0.05; done"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    pane = Pane(f"ccsup-top-{os.getpid()}", f"{CCSUP[0]} -m supervisor top; sleep 60", env)
    waiter = None
    try:
        wait_until(lambda: "1 held" in pane.screen(), what="top showing the holder")
        assert "no one waiting" in pane.screen()
        waiter = subprocess.Popen(
            [*CCSUP, "run", "--key", "t", "--", "echo", "waited"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        waits = []
        wait_until(
            lambda: bool(waits.extend(json.loads(ccsup("ps", "--json", state_dir=state_dir).stdout)["waits"]) or waits),
            what="the waiter queued",
        )  # fmt: skip
        short = waits[0]["id"][:8]
        # No key is pressed: the waiter's queued event alone brings it on the screen.
        wait_until(lambda: short in pane.screen(), what="top showing the new waiter")
        line = next(x for x in pane.screen().splitlines() if x.startswith(short))
        assert "key_full" in line and "echo waited" in line
        assert all(len(x) <= 80 for x in pane.screen().splitlines())

        pane.keys("Down", "c")  # the waiter is the second selectable row, after the holder
        wait_until(lambda: f"cancel turn {short} of t? [y/N]" in pane.screen(), what="the question")
        pane.keys("y", "Enter")
        assert waiter.wait(timeout=20) == 69  # `ccsup run` of a turn another client cancelled
        wait_until(lambda: f"turn {short}: cancelled" in pane.screen(), what="top saying so")
        assert json.loads(ccsup("ps", "--json", state_dir=state_dir).stdout)["waits"] == []
        wait_until(lambda: "no one waiting" in pane.screen(), what="the queue empty on screen")

        pane.keys("q")
        wait_until(lambda: "c cancel" not in pane.screen(), what="top gone after q")
    finally:
        go.touch()
        pane.close()
        holder.wait(timeout=20)
        if waiter is not None and waiter.poll() is None:
            waiter.kill()
            waiter.wait()


def test_the_view_fits_80_by_24_with_many_turns():
    now = 1_000_000.0
    slots = [
        {"key": f"k{i % 3}", "index": i, "cap": 40, "state": "held", "turn": f"{i:032x}",
         "since": now - i, "argv": ["sh", "-c", "x" * 200], "pid": 1}
        for i in range(100)
    ]  # fmt: skip
    waits = [
        {"id": f"{i:032x}", "key": "k1", "position": i, "since": now, "why": {"reason": "key_full"}}
        for i in range(1, 30)
    ]
    model = Model(status={"pid": 1, "started_at": now - 5}, ps={"slots": slots, "waits": waits})
    lines = render(model, now, 79, 24)
    assert len(lines) == 24 and all(len(line.text) <= 79 for line in lines)
    texts = [line.text for line in lines]
    assert any(t.startswith("TURN") for t in texts) and any(t.startswith("WAITING") for t in texts)
    assert any("more holders" in t for t in texts) and any("more waiting" in t for t in texts)
    assert texts[-1].startswith("c cancel")


@pytest.mark.parametrize("no_color", [False, True])
def test_top_colours_the_holders_unless_no_color(cli_daemon, tmp_path, no_color):
    state_dir = cli_daemon("[slots]\ncaps = { t = 1 }\n")
    go = tmp_path / "go"
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    env |= {"CCSUP_STATE_DIR": str(state_dir), "TERM": "xterm-256color"}
    env["CCSUP_CONFIG"] = str(state_dir / "ccsup.toml")
    if no_color:
        env["NO_COLOR"] = "1"
    holder = subprocess.Popen(
        [*CCSUP, "run", "--key", "t", "--", "sh", "-c", f"while [ ! -e {go} ]; do sleep 0.05; done"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    pane = Pane(f"ccsup-top-c{os.getpid()}", f"{CCSUP[0]} -m supervisor top; sleep 60", env)
    try:
        wait_until(lambda: "1 held" in pane.screen(), what="top showing the holder")
        # The key's line (not selectable, so not drawn reversed): held, so green unless NO_COLOR.
        plain = re.compile(r"\x1b\[[0-9;]*m")
        key_line = next(
            x for x in pane.screen(escapes=True).splitlines() if plain.sub("", x).startswith("t ")
        )
        assert ("\x1b[32m" not in key_line) == no_color, repr(key_line)
        pane.keys("q")
    finally:
        go.touch()
        pane.close()
        holder.wait(timeout=20)


def test_top_s_header_follows_a_restart_to_the_new_supervisor(cli_daemon):
    state_dir = cli_daemon(
        '[slots]\ncaps = { t = 1 }\n[guard]\ngrace = "300ms"\nadopt_within = "30s"\n'
    )
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    env |= {"CCSUP_STATE_DIR": str(state_dir), "TERM": "xterm-256color"}
    env["CCSUP_CONFIG"] = str(state_dir / "ccsup.toml")
    old = json.loads(ccsup("status", "--json", state_dir=state_dir).stdout)["pid"]
    pane = Pane(f"ccsup-top-r-{os.getpid()}", f"{CCSUP[0]} -m supervisor top; sleep 60", env)
    try:
        wait_until(lambda: f"pid {old} " in pane.screen(), what="top's header with the pid")
        done = ccsup("restart", state_dir=state_dir)
        assert done.returncode == 0, done.stderr
        new = json.loads(ccsup("status", "--json", state_dir=state_dir).stdout)["pid"]
        assert new != old
        wait_until(lambda: f"pid {new} " in pane.screen(), what="the new supervisor's pid")
        pane.keys("q")
    finally:
        pane.close()
        # the restarted supervisor is not the fixture's: stopped here, by the state directory
        ccsup("stop", state_dir=state_dir)


def test_escape_withdraws_a_prompt_and_a_wide_top_names_the_holders(cli_daemon, tmp_path):
    """At `p` (pause for how long?), typing then Escape pauses nothing and leaves the prompt at
    once (curses' getstr typed the Escape into the field); at 120 columns, HOLDER is shown."""
    state_dir = cli_daemon("[slots]\ncaps = { t = 1 }\n")
    go = tmp_path / "go"
    # COLUMNS would win over the pane's own width (curses reads it first)
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "COLUMNS", "LINES")}
    env |= {"CCSUP_STATE_DIR": str(state_dir), "TERM": "xterm-256color"}
    env["CCSUP_CONFIG"] = str(state_dir / "ccsup.toml")
    holder = subprocess.Popen(
        [*CCSUP, "run", "--key", "t", "--session", "s1", "--agent", "coder", "--", "sh", "-c",
         f"while [ ! -e {go} ]; do sleep 0.05; done"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    pane = Pane(f"ccsup-top-esc-{os.getpid()}", f"{CCSUP[0]} -m supervisor top; sleep 60", env,
                width=120)  # fmt: skip
    try:
        wait_until(lambda: "1 held" in pane.screen(), what="top showing the holder")
        wait_until(
            lambda: "HOLDER" in (shown := pane.screen()) and "s1/coder" in shown,
            what="the HOLDER column at 120 columns",
        )
        pane.keys("p")
        wait_until(lambda: "pause t for" in pane.screen(), what="the pause prompt")
        pane.keys("5m")
        wait_until(lambda: "pause t for [10m]: 5m" in pane.screen(), what="the typed answer")
        pane.keys("Escape")
        wait_until(lambda: "not paused" in pane.screen(), what="the prompt withdrawn")
        keys = json.loads(ccsup("ps", "--json", state_dir=state_dir).stdout)["keys"]
        assert not any(k.get("paused") for k in keys), keys
        pane.keys("q")
    finally:
        go.touch()
        pane.close()
        holder.wait(timeout=20)


def test_a_paused_key_that_never_ran_shows_its_cap_in_top():
    from supervisor.cli.views.top import key_rows

    paused = {"key": "fresh", "until": 2_000_000_000.0, "reason": None}
    ps = {"slots": [], "waits": [], "keys": [{"key": "fresh", "paused": paused, "cap": 3}]}
    rows = key_rows(Model(status={"pid": 1, "started_at": 1.0}, ps=ps))
    assert [(r[0], r[1]) for r in rows] == [("fresh", "3")]


def test_a_key_with_provider_windows_shows_its_fullest_in_top():
    from supervisor.cli.views.top import key_rows

    windows = [
        {"window": "7d", "used": 0.4, "resets_at": 2_000_000_000.0, "source": "cli", "seen_at": 1},
        {"window": "5h", "used": 0.97, "resets_at": 2_000_000_000.0, "source": "cli", "seen_at": 1},
    ]
    ps = {"slots": [], "waits": [], "keys": [{"key": "codex", "paused": None, "cap": 1,
                                              "quota": windows}]}  # fmt: skip
    [row] = key_rows(Model(status={"pid": 1, "started_at": 1.0}, ps=ps))
    assert row[4].startswith("5h 97% ")
