"""OpenCode itself (the npm package, pinned), against a scripted Chat Completions provider on
127.0.0.1 (a custom provider in its opencode.json): with `ccsup hook install opencode` (a
plugin's tool.execute.before) its bash calls run as ccsup turns, three sessions at once on a cap-1
key one at a time; through `ccsup mcp` (a local MCP server) its model calls run, then wait."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time

import pytest
from conftest import PYTHON, wait_until
from npm_harness import PINNED, cache_dir, harness_bin, plain_make, process_gone

from supervisor.agents.scripted import ScriptedProvider
from supervisor.history import db

CCSUP = [PYTHON, "-m", "supervisor"]


@pytest.fixture(scope="module")
def opencode():
    return harness_bin("opencode")


@pytest.fixture
def sandbox(daemon, state_dir, tmp_path):
    d = daemon(caps="default = 1")
    home = tmp_path / "home"
    config = home / ".config"
    (config / "opencode").mkdir(parents=True)
    work = tmp_path / "work"
    work.mkdir()
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("OPENAI", "OPENCODE", "CCSUP_"))
    }
    env.update(
        CCSUP_TEST_RUN=os.environ["CCSUP_TEST_RUN"],
        PWD=str(work),  # OpenCode takes its project directory from $PWD
        HOME=str(home),
        XDG_CONFIG_HOME=str(config),
        # OpenCode installs its provider's SDK package (from npm) into its cache: kept between tests
        XDG_CACHE_HOME=str(cache_dir().parent / "opencode-cache"),
        CCSUP_STATE_DIR=str(state_dir),
        CCSUP_CONFIG=str(d.config),
        CCSUP_HOOK_LOG=str(tmp_path / "hook.log"),
        OPENCODE_DISABLE_MODELS_FETCH="1",
        OPENCODE_DISABLE_AUTOUPDATE="1",
        OPENCODE_DISABLE_LSP_DOWNLOAD="1",
    )
    return {"env": env, "config": config, "work": work, "state_dir": state_dir, "tmp": tmp_path}


def provider_config(config, provider: ScriptedProvider) -> None:
    (config / "opencode" / "opencode.json").write_text(
        json.dumps(
            {
                "$schema": "https://opencode.ai/config.json",
                "provider": {
                    "scripted": {
                        "npm": "@ai-sdk/openai-compatible",
                        "name": "scripted",
                        "options": {"baseURL": f"{provider.url}/v1", "apiKey": "sk-scripted"},
                        "models": {"m": {"name": "m", "tool_call": True}},
                    }
                },
                "model": "scripted/m",
                "autoupdate": False,
                "share": "disabled",
            }
        )
    )


@pytest.mark.timeout(240)  # OpenCode's first start installs its provider SDK (30-60 s here)
def test_a_bash_call_runs_as_a_turn_with_the_session_and_its_setsid_daemon_ends_with_it(
    opencode, sandbox
):
    plugins = sandbox["config"] / "opencode" / "plugins"
    done = subprocess.run(
        [*CCSUP, "hook", "install", "opencode", "--settings", str(plugins)],
        env=sandbox["env"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    pidfile = sandbox["tmp"] / "daemon.pid"
    command = plain_make(
        sandbox["tmp"],
        "daemon",
        f"setsid sh -c 'trap \"\" TERM; echo $$ > {pidfile}; while :; do sleep 1; done' "
        "</dev/null >/dev/null 2>&1 & "
        f"while [ ! -s {pidfile} ]; do sleep 0.05; done; echo turn=${{CCSUP_TURN:-none}} in $PWD",
    )
    provider = ScriptedProvider([("bash", {"command": command, "description": "tests"})])
    provider_config(sandbox["config"], provider)
    daemon_pid = None
    try:
        ran = subprocess.run(
            [str(opencode), "run", "run it", "--model", "scripted/m"],
            cwd=sandbox["work"],
            env=sandbox["env"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=150,
        )
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
    plugins = sandbox["config"] / "opencode" / "plugins"
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
    subprocess.run(
        [*CCSUP, "hook", "install", "opencode", "--settings", str(plugins)],
        env=sandbox["env"],
        check=True,
        capture_output=True,
        timeout=30,
    )
    ok = subprocess.run(
        args, cwd=sandbox["work"], env=sandbox["env"], capture_output=True, text=True, timeout=280
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "ok: the rewrite took effect" in ok.stdout and PINNED["opencode"][1] in ok.stdout


@pytest.mark.timeout(300)
def test_three_opencode_sessions_on_a_cap_1_key_never_run_two_commands_at_once(opencode, sandbox):
    plugins = sandbox["config"] / "opencode" / "plugins"
    subprocess.run(
        [*CCSUP, "hook", "install", "opencode", "--settings", str(plugins)],
        env=sandbox["env"],
        check=True,
        capture_output=True,
        timeout=30,
    )
    running = sandbox["tmp"] / "running"
    running.mkdir()
    command = plain_make(
        sandbox["tmp"], "build", f"touch {running}/$$; sleep 1; rm {running}/$$; echo ran"
    )

    def then_wait(results):
        found = re.search(r"queued as ([0-9a-f]+).*?Run: (.*?) \(it waits", results[-1], re.S)
        return ("bash", {"command": found.group(2), "description": "wait"}) if found else None

    # OpenCode's starts are seconds apart under load: the model's first call goes out to all three
    # sessions together (once three have asked, or after 90 s), so that their commands overlap.
    asked = [0]
    together = threading.Condition()

    def build(results):
        with together:
            asked[0] += 1
            together.notify_all()
            together.wait_for(lambda: asked[0] >= 3, 90)
        return ("bash", {"command": command, "description": "build"})

    provider = ScriptedProvider([build, then_wait])
    provider_config(sandbox["config"], provider)
    most = [0]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            most[0] = max(most[0], len(os.listdir(running)))
            time.sleep(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    procs = []
    try:
        procs = [
            subprocess.Popen(
                [str(opencode), "run", "run it", "--model", "scripted/m"],
                cwd=sandbox["work"],
                # each its own data folder: three `opencode run` started at once on one folder
                # failed 1 run in 3 here with OpenCode's own "database is locked" (its SQLite)
                env={**sandbox["env"], "XDG_DATA_HOME": str(sandbox["tmp"] / f"data{n}")},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for n in range(3)
        ]
        outs = [p.communicate(timeout=200) for p in procs]
    finally:
        stop.set()
        sampler.join()
        provider.close()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    codes = [p.returncode for p in procs]
    assert codes == [0, 0, 0], (codes, [o[0][-1500:] + o[1][-1500:] for o in outs])
    assert most[0] == 1, provider.results
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


def _answer(output: str) -> dict:
    return json.JSONDecoder().raw_decode(output[output.index("{") :])[0]


@pytest.mark.timeout(240)
def test_through_mcp_the_model_calls_run_then_wait(opencode, sandbox):
    mcp_env = {k: sandbox["env"][k] for k in ("CCSUP_STATE_DIR", "CCSUP_CONFIG", "CCSUP_TEST_RUN")}

    def wait_for(results):
        return ("ccsup_wait", {"id": _answer(results[0])["id"]})

    provider = ScriptedProvider(
        [("ccsup_run", {"command": "sleep 2; echo via-mcp"}), wait_for, wait_for, wait_for]
    )
    provider_config(sandbox["config"], provider)
    path = sandbox["config"] / "opencode" / "opencode.json"
    config = json.loads(path.read_text())
    config["mcp"] = {
        "ccsup": {
            "type": "local",
            "command": [PYTHON, "-m", "supervisor", "mcp"],
            "environment": {**mcp_env, "CCSUP_MCP_BOUND": "1"},
            "enabled": True,
        }
    }
    path.write_text(json.dumps(config))
    try:
        ran = subprocess.run(
            [str(opencode), "run", "run it", "--model", "scripted/m"],
            cwd=sandbox["work"],
            env=sandbox["env"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=150,
        )
    finally:
        provider.close()
    assert ran.returncode == 0, ran.stderr[-2000:]
    offered = [
        sorted((t.get("function") or {}).get("name") for t in r.get("tools") or [])
        for r in provider.requests
    ]
    assert provider.results, offered
    first = _answer(provider.results[0])
    assert first["state"] in ("running", "queued") and "call `wait`" in first["next"]
    ended = [_answer(r) for r in provider.results[1:] if '"ended"' in r]
    assert ended and ended[0]["stdout_tail"] == "via-mcp\n" and ended[0]["id"] == first["id"]
    [turn] = db.query(sandbox["state_dir"])  # run once, waited on by id
    assert turn["outcome"] == "ok", turn
