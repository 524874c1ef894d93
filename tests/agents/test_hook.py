"""`ccsup hook run <harness>`: the hook JSON of Claude Code, Codex and OpenCode in, a pass, a
rewrite or a refusal out; the rewritten command means exactly what the original meant."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from conftest import PYTHON, ROOT, wait_until

HOOK = [PYTHON, "-S", str(ROOT / "supervisor" / "agents" / "fast_hook.py")]
CCSUP = [PYTHON, "-m", "supervisor"]
SECRET = "s3cr3t-value-0f-the-agent"


def hook(
    harness: str, payload: bytes | dict, env: dict, *flags: str
) -> subprocess.CompletedProcess:
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return subprocess.run(
        [*HOOK, harness, *flags], input=data, env=env, capture_output=True, timeout=30
    )


def claude_payload(command, cwd="/tmp", session="sess-a") -> dict:
    return {
        "session_id": session,
        "cwd": cwd,
        "hook_event_name": "PreToolUse",
        "tool_name": "Bash",
        "tool_input": {"command": command, "description": "d", "timeout": 120000},
        "tool_use_id": "toolu_1",
    }


@pytest.fixture
def base_env(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCSUP_")}
    env["CCSUP_TEST_RUN"] = os.environ["CCSUP_TEST_RUN"]
    env["CCSUP_HOOK_LOG"] = str(tmp_path / "hook.log")
    env["XDG_CONFIG_HOME"] = str(tmp_path / "xdg")
    return env


@pytest.fixture
def env(daemon, state_dir, base_env):
    d = daemon(caps="default = 1")
    return {**base_env, "CCSUP_STATE_DIR": str(state_dir), "CCSUP_CONFIG": str(d.config)}


def test_a_command_that_matches_nothing_passes_untouched_without_click_or_zmq(base_env):
    done = hook("claude", claude_payload("ls -la"), base_env)
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    traced = subprocess.run(
        [PYTHON, "-X", "importtime", *HOOK[1:], "claude"],
        input=json.dumps(claude_payload("git status")).encode(),
        env=base_env,
        capture_output=True,
        timeout=30,
    )
    imported = {line.rsplit("|", 1)[-1].strip() for line in traced.stderr.decode().splitlines()}
    assert "supervisor.agents.rules" in imported
    # nothing parsed: not even json (nor re), let alone click or zmq
    assert not {m for m in imported if m.split(".")[0] in ("json", "re", "click", "zmq", "typing")}


@pytest.mark.parametrize(
    "payload, why",
    [
        (b"not json {", "not a hook payload"),
        (b"[1, 2]", "JSON list, not an object"),
        (json.dumps({"tool_name": "Bash"}).encode(), "no tool input object"),
        (json.dumps({"tool_name": "Bash", "tool_input": {"command": 7}}).encode(), "not a string"),
    ],
)
def test_a_bad_payload_leaves_the_command_untouched_and_logs_why(base_env, tmp_path, payload, why):
    done = hook("claude", payload, base_env)
    assert (done.returncode, done.stdout) == (0, b"")
    assert why in (tmp_path / "hook.log").read_text()


def test_another_tool_is_not_looked_at(base_env):
    done = hook("claude", {"tool_name": "Write", "tool_input": {"file_path": "/x"}}, base_env)
    assert (done.returncode, done.stdout) == (0, b"")


def hostile_command() -> str:
    # spaces, both quotes, $, a newline, a command substitution, and bytes that are not UTF-8
    raw = (
        b'printf \'<%s>\' "a  b" \'$HOME\' "it\'s" "$(printf \'x\\ny\')" "$AGENT_SECRET"\n'
        b"printf '\\n'; printf 'caf\xc3\xa9 \xff\xfe\\n'; echo err >&2; exit 7"
    )
    return raw.decode("utf-8", "surrogateescape")


def test_a_matching_hostile_command_runs_as_a_turn_meaning_exactly_what_it_meant(
    env, state_dir, tmp_path
):
    command = "make -s -f /dev/null 2>/dev/null; " + hostile_command()
    payload = json.dumps(claude_payload(command, cwd=str(tmp_path)), ensure_ascii=False)
    done = hook("claude", payload.encode("utf-8", "surrogateescape"), env)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.decode("utf-8", "surrogateescape"))["hookSpecificOutput"]
    # several commands on one line: rewritten, and Claude Code decides as it would ("ask")
    assert out["permissionDecision"] == "ask" and out["hookEventName"] == "PreToolUse"
    assert out["updatedInput"]["description"] == "d"  # the rest of the tool input is kept
    rewritten = out["updatedInput"]["command"]
    assert rewritten != command and " run --key default --pass-env " in rewritten
    agent_env = {**env, "AGENT_SECRET": SECRET}
    as_agent = {"cwd": tmp_path, "env": agent_env, "capture_output": True, "timeout": 60}
    original = subprocess.run(
        ["bash", "-c", command.encode("utf-8", "surrogateescape")], **as_agent
    )
    through = subprocess.run(
        ["bash", "-c", rewritten.encode("utf-8", "surrogateescape")], **as_agent
    )
    assert (
        original.returncode == 7
        and b"\xff\xfe" in original.stdout
        and SECRET.encode() in original.stdout
    )
    assert (through.returncode, through.stdout, through.stderr) == (
        original.returncode,
        original.stdout,
        original.stderr,
    )
    from supervisor.history import db

    [turn] = wait_until(lambda: db.query(state_dir), 10, 0.05, "the history to hold the turn")
    assert (turn["holder"]["session"], turn["holder"]["harness"], turn["exit_code"]) == (
        "sess-a",
        "claude",
        7,
    )
    for path in state_dir.rglob("*"):  # the agent's environment stays out of every record
        if path.is_file() and not path.name.endswith(".log") and not path.is_socket():
            assert SECRET.encode() not in path.read_bytes(), path


def test_a_busy_key_queues_the_command_and_refuses_with_what_to_run(env, state_dir, tmp_path):
    go = tmp_path / "go"
    holder = subprocess.Popen(
        [*CCSUP, "run", "--", "sh", "-c", f"echo ready; while [ ! -e {go} ]; do sleep 0.05; done"],
        env=env,
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout.readline() == b"ready\n"
        done = hook(
            "claude",
            claude_payload("echo ran-in $PWD", cwd=str(tmp_path)),
            env,
            "--match",
            "^echo ran-in",
        )
        out = json.loads(done.stdout)["hookSpecificOutput"]
        assert out["permissionDecision"] == "deny"
        reason = out["permissionDecisionReason"]
        assert "queued as " in reason and "position 1" in reason and " wait " in reason
        turn_id = reason.split("queued as ")[1].split(",")[0]
        early = subprocess.run(
            [*CCSUP, "wait", turn_id, "--timeout", "0.5"], env=env, capture_output=True, timeout=30
        )
        assert early.returncode == 75 and b"still queued" in early.stderr
        go.write_text("")
        waited = subprocess.run([*CCSUP, "wait", turn_id], env=env, capture_output=True, timeout=30)
        assert waited.returncode == 0, waited.stderr
        assert f"ran-in {tmp_path}".encode() in waited.stdout
        again = subprocess.run([*CCSUP, "wait", turn_id], env=env, capture_output=True, timeout=30)
        assert (again.returncode, again.stdout) == (waited.returncode, waited.stdout)
    finally:
        go.write_text("")
        holder.wait(30)


def test_ccsup_wait_exits_with_the_commands_status_and_refuses_an_unknown_id(env):
    ran = subprocess.run(
        [*CCSUP, "run", "--json", "--", "sh", "-c", "echo hi; exit 5"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    turn_id = json.loads(ran.stdout.splitlines()[0])["body"]["id"]
    waited = subprocess.run([*CCSUP, "wait", turn_id], env=env, capture_output=True, timeout=30)
    assert (waited.returncode, waited.stdout) == (5, b"hi\n")
    unknown = subprocess.run(
        [*CCSUP, "wait", "nosuchturn"], env=env, capture_output=True, timeout=30
    )
    assert unknown.returncode == 1 and b"no turn nosuchturn on " in unknown.stderr


def test_no_supervisor_passes_by_default_and_refuses_when_configured(base_env, tmp_path):
    env = {**base_env, "CCSUP_STATE_DIR": str(tmp_path / "nothing-runs-here")}
    first = hook("claude", claude_payload("pytest"), env)
    assert first.returncode == 0 and b"no supervisor is running" in first.stdout
    assert "permissionDecision" not in first.stdout.decode()
    second = hook("claude", claude_payload("pytest"), env)
    assert (second.returncode, second.stdout) == (0, b"")  # said once
    assert "no supervisor running" in (tmp_path / "hook.log").read_text()
    config = tmp_path / "refuse.toml"
    config.write_text('[hooks]\nwhen_down = "refuse"\n')
    refused = hook("claude", claude_payload("pytest"), {**env, "CCSUP_CONFIG": str(config)})
    out = json.loads(refused.stdout)["hookSpecificOutput"]
    assert out["permissionDecision"] == "deny" and "ccsup start" in out["permissionDecisionReason"]


def test_codex_and_opencode_payloads_and_rules_from_flags_and_config(env, tmp_path):
    codex = {
        "session_id": "thread-1",
        "cwd": str(tmp_path),
        "hook_event_name": "PreToolUse",
        "tool_name": "Bash",
        "tool_input": {"command": "run-my-suite"},
    }
    assert hook("codex", codex, env).stdout == b""  # matches no default rule
    out = json.loads(hook("codex", codex, env, "--match", r"run-my-suite").stdout)
    assert out["hookSpecificOutput"]["permissionDecision"] == "allow"
    assert "--harness codex" in out["hookSpecificOutput"]["updatedInput"]["command"]
    # `./run-my-suite` may be any program: never approved; the model is told how to run it capped
    local = {**codex, "tool_input": {"command": "./run-my-suite"}}
    out = json.loads(hook("codex", local, env, "--match", r"run-my-suite").stdout)
    said = out["hookSpecificOutput"]
    assert said["permissionDecision"] == "deny"
    assert said["permissionDecisionReason"].endswith("-- /bin/bash -c ./run-my-suite") or (
        said["permissionDecisionReason"].endswith(" -c ./run-my-suite")
    )
    opencode = {
        "tool": "bash",
        "sessionID": "ses_1",
        "callID": "c1",
        "args": {"command": "cargo test"},
        "directory": str(tmp_path),
    }
    answer = json.loads(hook("opencode", opencode, env, "--key", "other").stdout)  # default is held
    assert answer["action"] == "rewrite" and "--session ses_1" in answer["command"]
    config = tmp_path / "rules.toml"
    config.write_text(
        open(env["CCSUP_CONFIG"]).read()
        + '\n[hooks]\nrules = ["^run-my-suite"]\ndefaults = false\nkey = "suites"\n'
    )
    with_config = {**env, "CCSUP_CONFIG": str(config)}
    out = json.loads(hook("codex", codex, with_config).stdout)
    assert "--key suites" in out["hookSpecificOutput"]["updatedInput"]["command"]
    assert (
        hook("codex", {**codex, "tool_input": {"command": "cargo test"}}, with_config).stdout == b""
    )


MATCHED = [
    "pytest -q",
    "cd x && python -m pytest",
    "FOO=1 make -j4",
    "docker compose up",
    "npm test",
    "cargo build --release",
    "sudo apt-get install -y x",
    "(cd a; make)",
    "pip install -e .",
    "go test ./...",
    "uv pip install x",
    "yarn build",
    "./gradlew build",
    "echo ccsup-canary-1",
]
PASSED = ["ls -la", "git status", "echo pytest", "grep make x", "mypytest", "ccsup run -- pytest"]


@pytest.mark.parametrize("command", MATCHED + PASSED)
def test_the_payload_prefilter_never_passes_a_command_the_rules_take(command):
    from supervisor.agents import rules

    taken = rules.rule_for(command, []) is not None
    assert taken == (command in MATCHED)
    for payload in (
        json.dumps(claude_payload(command)),
        json.dumps(claude_payload(command), separators=(",", ":")),
    ):
        if taken:
            assert not rules.surely_unmatched(payload.encode())
    assert rules.surely_unmatched(json.dumps(claude_payload("ls -la")).encode())
    assert not rules.surely_unmatched(b'{"tool_input": {"command": 7}}')  # parsed, then logged


def test_the_hook_log_makes_a_private_state_directory(tmp_path):
    """The hook may be the first to make the state directory (its log lives there): made 0700,
    the log 0600, so a supervisor started there later does not refuse it."""
    state = tmp_path / "xdg-state"
    env = {k: v for k, v in os.environ.items() if k not in ("CCSUP_HOOK_LOG", "CCSUP_STATE_DIR")}
    env |= {"XDG_STATE_HOME": str(state), "CCSUP_CONFIG": "/dev/null"}
    env["CCSUP_STATE_DIR"] = str(tmp_path / "nowhere")  # no supervisor: the log says so
    done = subprocess.run(
        [*CCSUP, "hook", "run", "claude"],
        input=b"not json",
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0
    assert (state / "ccsup").stat().st_mode & 0o777 == 0o700
    assert (state / "ccsup" / "hook.log").stat().st_mode & 0o777 == 0o600
