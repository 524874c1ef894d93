"""OpenCode itself (the npm package, pinned), against a scripted Chat Completions provider on
127.0.0.1 (a custom provider in its opencode.json): with `ccsup hook install opencode` (a
plugin's tool.execute.before) its bash calls run as ccsup turns, three sessions at once on a cap-1
key one at a time; through `ccsup mcp` (a local MCP server) its model calls run, then wait."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading

import pytest
from conftest import PYTHON, wait_until
from harness_sandbox import (
    CCSUP,
    AtOnce,
    install_hook,
    make_sandbox,
    mcp_answer,
    mcp_env,
    opencode_config,
    opencode_env,
    ran_then_waited,
    run_all,
    setsid_daemon,
    then_wait,
)
from npm_harness import PINNED, harness_bin, process_gone

from supervisor.agents.scripted import ScriptedProvider
from supervisor.history import db


@pytest.fixture(scope="module")
def opencode():
    return harness_bin("opencode")


@pytest.fixture
def sandbox(daemon, state_dir, tmp_path):
    box = make_sandbox(daemon, state_dir, tmp_path, strip=("OPENAI", "OPENCODE"))
    box["config"] = box["home"] / ".config"
    box["plugins"] = box["config"] / "opencode" / "plugins"
    box["env"].update(
        PWD=str(box["work"]),  # OpenCode takes its project directory from $PWD
        **opencode_env(box["home"], tmp_path),
    )
    return box


def run_opencode(opencode, sandbox) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(opencode), "run", "run it", "--model", "scripted/m"],
        cwd=sandbox["work"],
        env=sandbox["env"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=150,
    )


@pytest.mark.timeout(240)
def test_a_bash_call_runs_as_a_turn_with_the_session_and_its_setsid_daemon_ends_with_it(
    opencode, sandbox
):
    install_hook("opencode", sandbox["plugins"], sandbox["env"])
    command, pidfile = setsid_daemon(sandbox["tmp"])
    provider = ScriptedProvider([("bash", {"command": command, "description": "tests"})])
    opencode_config(sandbox["config"], provider)
    daemon_pid = None
    try:
        ran = run_opencode(opencode, sandbox)
        assert ran.returncode == 0, ran.stderr[-2000:]
        daemon_pid = int(pidfile.read_text())
        [seen] = provider.results
        match = re.search(r"turn=(\S+) in (\S+)", seen)
        assert match and match.group(1) != "none", seen
        assert match.group(2) == str(sandbox["work"])
        turn = db.show(sandbox["state_dir"], match.group(1))
        assert turn["holder"]["harness"] == "opencode" and turn["holder"]["session"].startswith(
            "ses"
        )
        wait_until(
            lambda: process_gone(daemon_pid),
            15,
            0.05,
            "the setsid daemon to end",
        )
    finally:
        provider.close()
        if daemon_pid and not process_gone(daemon_pid):
            os.kill(daemon_pid, signal.SIGKILL)


def test_versions_are_the_pinned_ones(opencode):
    out = subprocess.run([str(opencode), "--version"], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == PINNED["opencode"][1]


@pytest.mark.timeout(300)
def test_the_doctor_says_the_rewrite_took_effect_in_opencode(opencode, sandbox):
    plugins = sandbox["plugins"]
    args = [
        *CCSUP,
        "hook",
        "doctor",
        "opencode",
        "--bin",
        str(opencode),
        "--settings",
        str(plugins),
    ]
    missing = subprocess.run(
        args, cwd=sandbox["work"], env=sandbox["env"], capture_output=True, text=True, timeout=60
    )
    assert missing.returncode == 1 and "no ccsup hook" in missing.stdout
    install_hook("opencode", plugins, sandbox["env"])
    ok = subprocess.run(
        args, cwd=sandbox["work"], env=sandbox["env"], capture_output=True, text=True, timeout=280
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "ok: the rewrite took effect" in ok.stdout and PINNED["opencode"][1] in ok.stdout


@pytest.mark.timeout(300)
def test_three_opencode_sessions_on_a_cap_1_key_never_run_two_commands_at_once(opencode, sandbox):
    install_hook("opencode", sandbox["plugins"], sandbox["env"])
    at_once = AtOnce(sandbox["tmp"])

    # OpenCode's starts are seconds apart under load: the model's first call goes out to all three
    # sessions together (once three have asked, or after 90 s), so that their commands overlap.
    asked = [0]
    together = threading.Condition()

    def build(results):
        with together:
            asked[0] += 1
            together.notify_all()
            together.wait_for(lambda: asked[0] >= 3, 90)
        return ("bash", {"command": at_once.command, "description": "build"})

    provider = ScriptedProvider([build, then_wait("bash", "command", description="wait")])
    opencode_config(sandbox["config"], provider)
    try:
        with at_once:
            procs = [
                subprocess.Popen(
                    [str(opencode), "run", "run it", "--model", "scripted/m"],
                    cwd=sandbox["work"],
                    # each its own data folder: three `opencode run` started at once on one
                    # folder failed 1 run in 3 here with OpenCode's own "database is locked"
                    env={**sandbox["env"], "XDG_DATA_HOME": str(sandbox["tmp"] / f"data{n}")},
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                for n in range(3)
            ]
            outs = run_all(procs, 200)
    finally:
        provider.close()
    codes = [p.returncode for p in procs]
    assert codes == [0, 0, 0], (codes, [o[0][-1500:] + o[1][-1500:] for o in outs])
    assert at_once.most == 1, provider.results
    turns = wait_until(
        lambda: len(db.query(sandbox["state_dir"])) == 3 and db.query(sandbox["state_dir"]),
        15,
        0.1,
        "three turns in the history",
    )
    assert {t["outcome"] for t in turns} == {"ok"}
    sessions = {t["holder"]["session"] for t in turns}
    assert len(sessions) == 3 and all(s.startswith("ses") for s in sessions), sessions
    assert {t["holder"]["harness"] for t in turns} == {"opencode"}
    assert sum(r.strip().endswith("ran") for r in provider.results) == 3, provider.results
    # the queued ones were refused with what to run (`ccsup wait`), and ran it
    assert any("your command is queued as" in r for r in provider.results), provider.results
    # The sessions overlapped: a turn was queued while another ran, and granted after it ended.
    assert any(
        a["queued_at"] < b["exited_at"] <= a["granted_at"]
        for a in turns
        for b in turns
        if a is not b
    ), [(t["queued_at"], t["granted_at"], t["exited_at"]) for t in turns]


@pytest.mark.timeout(240)
def test_through_mcp_the_model_calls_run_then_wait(opencode, sandbox):
    def wait_for(results):
        return ("ccsup_wait", {"id": mcp_answer(results[0])["id"]})

    provider = ScriptedProvider(
        [("ccsup_run", {"command": "sleep 2; echo via-mcp"}), wait_for, wait_for, wait_for]
    )
    server = {
        "type": "local",
        "command": [PYTHON, "-m", "supervisor", "mcp"],
        "environment": mcp_env(sandbox["env"]),
        "enabled": True,
    }
    opencode_config(sandbox["config"], provider, mcp={"ccsup": server})
    try:
        ran = run_opencode(opencode, sandbox)
    finally:
        provider.close()
    assert ran.returncode == 0, ran.stderr[-2000:]
    offered = [
        sorted((t.get("function") or {}).get("name") for t in r.get("tools") or [])
        for r in provider.requests
    ]
    ran_then_waited(provider, offered)
    [turn] = db.query(sandbox["state_dir"])  # run once, waited on by id
    assert turn["outcome"] == "ok", turn
