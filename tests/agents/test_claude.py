"""Claude Code itself (the npm package, pinned), against a scripted Anthropic provider on
127.0.0.1: with `ccsup hook install claude` its Bash commands run as ccsup turns; through
`ccsup mcp` its model calls run, then wait."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess

import pytest
from conftest import PYTHON, wait_until
from harness_sandbox import (
    CCSUP,
    AtOnce,
    make_sandbox,
    mcp_answer,
    mcp_env,
    ran_then_waited,
    run_all,
    setsid_daemon,
    then_wait,
)
from harness_sandbox import install_hook as install
from npm_harness import PINNED, harness_bin, plain_make, process_gone

from supervisor.agents.scripted import ScriptedProvider
from supervisor.history import db


@pytest.fixture(scope="module")
def claude():
    return harness_bin("claude")


@pytest.fixture
def sandbox(daemon, state_dir, tmp_path):
    """A supervisor (cap 1), a HOME of the test's own, and the env."""
    box = make_sandbox(daemon, state_dir, tmp_path, strip=("ANTHROPIC", "CLAUDE"))
    box["settings"] = box["home"] / ".claude" / "settings.json"
    box["env"].update(
        ANTHROPIC_API_KEY="sk-ant-scripted",
        DISABLE_TELEMETRY="1",
        DISABLE_AUTOUPDATER="1",
        DISABLE_ERROR_REPORTING="1",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        ENABLE_TOOL_SEARCH="false",  # MCP tools offered as they are, not deferred behind a search
    )
    return box


def install_hook(sandbox) -> None:
    install("claude", sandbox["settings"], sandbox["env"])


def run_claude(claude, sandbox, provider, *extra, prompt="run it") -> subprocess.Popen:
    env = {**sandbox["env"], "ANTHROPIC_BASE_URL": provider.url}
    return subprocess.Popen(
        [
            str(claude),
            "-p",
            prompt,
            "--output-format",
            "json",
            "--model",
            "claude-sonnet-4-5",
            *extra,
        ],
        cwd=sandbox["work"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen, timeout: float = 90) -> dict:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    assert proc.returncode == 0, err[-2000:]
    return json.loads(out)


def test_a_bash_command_runs_as_a_turn_with_the_session_and_its_setsid_daemon_ends_with_it(
    claude, sandbox
):
    install_hook(sandbox)
    command, pidfile = setsid_daemon(sandbox["tmp"])
    provider = ScriptedProvider([("Bash", {"command": command, "description": "tests"})])
    daemon_pid = None
    try:
        result = finish(run_claude(claude, sandbox, provider))
        daemon_pid = int(pidfile.read_text())
        [seen] = provider.results
        match = re.search(r"turn=(\S+) in (\S+)", seen)
        assert match and match.group(1) != "none", seen  # the command ran inside a ccsup turn
        assert match.group(2) == str(sandbox["work"])  # in the agent's cwd
        turn = db.show(sandbox["state_dir"], match.group(1))
        assert (
            turn["holder"]["session"] == result["session_id"]
            and turn["holder"]["harness"] == "claude"
        )
        # the daemon that detached and ignores SIGTERM ended with the turn
        wait_until(
            lambda: process_gone(daemon_pid),
            15,
            0.05,
            "the setsid daemon to end",
        )
        wait_until(
            lambda: (
                (db.show(sandbox["state_dir"], match.group(1)) or {}).get("state") == "released"
            ),
            15,
            0.05,
            "the turn's release",
        )
    finally:
        provider.close()
        if daemon_pid and os.path.exists(f"/proc/{daemon_pid}"):
            os.kill(daemon_pid, signal.SIGKILL)


def test_in_a_mode_that_asks_a_plain_command_runs_capped_and_a_hostile_line_never_runs(
    claude, sandbox
):
    """Default permission mode, `-p`: nobody can answer a prompt, so a command Claude Code would
    ask about is refused. The hook's "allow" runs the plain one as a turn; a line with a hostile
    part gets the rewrite with "ask": refused, its marker never made."""
    install_hook(sandbox)
    marker = sandbox["tmp"] / "PWNED"
    plain = plain_make(sandbox["tmp"], "plain", "echo turn=${CCSUP_TURN:-none}")
    hostile = f"{plain}; touch {marker}"
    provider = ScriptedProvider(
        [
            ("Bash", {"command": plain, "description": "build"}),
            ("Bash", {"command": hostile, "description": "build"}),
            ("Bash", {"command": f"touch {marker}", "description": "control"}),
        ]
    )
    try:
        finish(run_claude(claude, sandbox, provider))
    finally:
        provider.close()
    ran, asked, control = provider.results
    turn = re.search(r"turn=(\S+)", ran)
    assert turn and turn.group(1) != "none", ran  # ran as a turn, nobody asked
    assert db.show(sandbox["state_dir"], turn.group(1)) is not None
    assert not marker.exists(), asked
    assert "turn=" not in asked, asked
    assert not marker.exists(), control  # the mode really asks: a plain touch is refused too


def test_with_the_sandbox_on_a_hooked_command_runs_as_a_turn(claude, sandbox):
    """Claude Code's sandbox (bubblewrap on Linux) around the Bash tool: the hooked command's
    `ccsup run` must reach the supervisor's sockets from inside it."""
    if not (shutil.which("bwrap") and shutil.which("socat")):
        pytest.skip("Claude Code's Linux sandbox needs bubblewrap and socat: not installed here")
    install_hook(sandbox)
    settings = sandbox["settings"]
    data = json.loads(settings.read_text())
    data.setdefault("sandbox", {}).update(
        enabled=True, failIfUnavailable=True, allowUnsandboxedCommands=False
    )
    settings.write_text(json.dumps(data))
    outside = sandbox["tmp"] / "outside-the-sandbox"
    plain = plain_make(
        sandbox["work"], "sandboxed", f"echo turn=${{CCSUP_TURN:-none}}; touch {outside}"
    )
    provider = ScriptedProvider([("Bash", {"command": plain, "description": "build"})])
    try:
        finish(run_claude(claude, sandbox, provider))
    finally:
        provider.close()
    [seen] = provider.results
    turn = re.search(r"turn=(\S+)", seen)
    assert turn and turn.group(1) != "none", seen
    assert db.show(sandbox["state_dir"], turn.group(1)) is not None
    # the turn ran in the supervisor's world, not the harness's sandbox: it wrote outside the
    # project (what docs/agents.md says a sandbox no longer contains)
    assert outside.exists()


def test_three_sessions_on_a_cap_1_key_never_run_two_commands_at_once(claude, sandbox):
    install_hook(sandbox)
    at_once = AtOnce(sandbox["tmp"])
    provider = ScriptedProvider(
        [
            ("Bash", {"command": at_once.command, "description": "build"}),
            then_wait("Bash", "command", description="wait"),
        ]
    )
    try:
        with at_once:
            procs = [run_claude(claude, sandbox, provider) for _ in range(3)]
            outs = run_all(procs, 150)
    finally:
        provider.close()
    assert [p.returncode for p in procs] == [0, 0, 0], [err[-2000:] for _, err in outs]
    results = [json.loads(out) for out, _ in outs]
    log = sandbox["tmp"] / "hook.log"
    assert at_once.most == 1, (provider.results, log.read_text() if log.exists() else "")
    turns = db.query(sandbox["state_dir"])
    assert len(turns) == 3, (provider.results, log.read_text() if log.exists() else "")
    assert {t["outcome"] for t in turns} == {"ok"}
    assert {t["holder"]["session"] for t in turns} == {r["session_id"] for r in results}
    queued = [r for r in provider.results if "queued as" in r]
    assert queued, provider.results  # at least one was refused with what to run, and ran it
    assert sum("ran" in r for r in provider.results if "queued as" not in r) == 3


def test_through_mcp_the_model_calls_run_then_wait(claude, sandbox):
    config = sandbox["tmp"] / "mcp.json"
    config.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "ccsup": {
                        "command": PYTHON,
                        "args": ["-m", "supervisor", "mcp"],
                        "env": mcp_env(sandbox["env"]),
                    }
                }
            }
        )
    )

    def wait_for(results):
        return ("mcp__ccsup__wait", {"id": mcp_answer(results[-1])["id"]})

    provider = ScriptedProvider(
        [("mcp__ccsup__run", {"command": "sleep 2; echo via-mcp"}), wait_for, wait_for, wait_for]
    )
    try:
        finish(
            run_claude(
                claude,
                sandbox,
                provider,
                "--mcp-config",
                str(config),
                "--allowedTools",
                "mcp__ccsup__run mcp__ccsup__wait",
            )
        )
    finally:
        provider.close()
    offered = [sorted(t.get("name") for t in r.get("tools") or []) for r in provider.requests]
    ran_then_waited(provider, offered)
    assert len(db.query(sandbox["state_dir"])) == 1  # run once, waited on by id


def test_versions_are_the_pinned_ones(claude):
    out = subprocess.run([str(claude), "--version"], capture_output=True, text=True, timeout=60)
    assert out.stdout.split()[0] == PINNED["claude"][1]


def doctor(claude, sandbox) -> subprocess.CompletedProcess:
    settings = sandbox["settings"]
    return subprocess.run(
        [*CCSUP, "hook", "doctor", "claude", "--bin", str(claude), "--settings", str(settings)],
        cwd=sandbox["work"],
        env=sandbox["env"],
        capture_output=True,
        text=True,
        timeout=150,
    )


def test_the_doctor_says_the_rewrite_took_effect_and_fails_loudly_when_it_is_dropped(
    claude, sandbox
):
    missing = doctor(claude, sandbox)
    assert missing.returncode == 1 and "no ccsup hook" in missing.stdout
    install_hook(sandbox)
    ok = doctor(claude, sandbox)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "ok: the rewrite took effect: the canary ran as turn " in ok.stdout
    assert PINNED["claude"][1] in ok.stdout
    # A build that drops the rewrite: the hook allows the call but its command runs as it was.
    settings = sandbox["settings"]
    data = json.loads(settings.read_text())
    allow = '{"hookSpecificOutput":{"hookEventName":"PreToolUse","permissionDecision":"allow"}}'
    data["hooks"]["PreToolUse"][0]["hooks"][0]["command"] = f"echo '{allow}' #ccsup-hook"
    settings.write_text(json.dumps(data))
    dropped = doctor(claude, sandbox)
    assert dropped.returncode == 1 and "DROPPED" in dropped.stdout, dropped.stdout + dropped.stderr
