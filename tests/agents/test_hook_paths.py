"""No PATH and no environment assumptions: the installed hook carries the state directory and
config it was installed with; what it hands the model (the rewrite, the `wait` line) names our
interpreter, state directory and config by absolute path, so that a login shell (Codex runs
`bash -lc`, whose /etc/profile resets PATH) without ccsup on PATH runs them all the same."""

from __future__ import annotations

import json
import os
import shlex
import subprocess

from conftest import PYTHON

CCSUP = [PYTHON, "-m", "supervisor"]


def claude_payload(command: str, cwd: str) -> bytes:
    return json.dumps(
        {
            "session_id": "sess-paths",
            "cwd": cwd,
            "hook_event_name": "PreToolUse",
            "tool_name": "Bash",
            "tool_input": {"command": command},
        }
    ).encode()


def login_shell_env(tmp_path) -> dict:
    """What a harness's login shell has: no CCSUP_*, a PATH of the system's alone."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {
        "HOME": str(home),
        "PATH": "/usr/bin:/bin",
        "CCSUP_TEST_RUN": os.environ["CCSUP_TEST_RUN"],
        "LANG": "C.UTF-8",
    }


def test_the_installed_hook_carries_its_state_dir_and_config_into_a_bare_login_shell(
    daemon, state_dir, tmp_path
):
    d = daemon(caps="default = 1")
    settings = tmp_path / "settings.json"
    installed = subprocess.run(
        [
            *CCSUP,
            "--state-dir",
            str(state_dir),
            "--config",
            str(d.config),
            "hook",
            "install",
            "claude",
            "--settings",
            str(settings),
        ],
        env={k: v for k, v in os.environ.items() if not k.startswith("CCSUP_")}
        | {"CCSUP_TEST_RUN": os.environ["CCSUP_TEST_RUN"]},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert installed.returncode == 0, installed.stderr
    command = json.loads(settings.read_text())["hooks"]["PreToolUse"][0]["hooks"][0]["command"]
    assert f"--state-dir {shlex.quote(str(state_dir))}" in command
    bare = login_shell_env(tmp_path) | {"CCSUP_HOOK_LOG": str(tmp_path / "hook.log")}
    # the harness runs the hook command through a shell, with its own environment: no CCSUP_*
    mk = tmp_path / "build.mk"
    mk.write_text("all:\n\t@echo turn=$$CCSUP_TURN\n")
    hooked = subprocess.run(
        ["bash", "-lc", command],
        input=claude_payload(f"make -s -f {mk}", str(tmp_path)),
        env=bare,
        capture_output=True,
        timeout=60,
    )
    out = json.loads(hooked.stdout)["hookSpecificOutput"]
    assert out["permissionDecision"] == "allow", out
    rewritten = out["updatedInput"]["command"]
    assert rewritten.startswith(shlex.join([PYTHON, "-m", "supervisor", "--state-dir"]))
    # the rewrite, run as Codex runs commands (a login shell, ccsup on no PATH)
    ran = subprocess.run(
        ["bash", "-lc", rewritten], env=bare, cwd=tmp_path, capture_output=True, timeout=60
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith(b"turn=") and ran.stdout.strip() != b"turn=", ran.stdout


def test_a_queued_agents_wait_line_works_in_a_login_shell_without_ccsup_on_path(
    daemon, state_dir, tmp_path
):
    d = daemon(caps="default = 1")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCSUP_")}
    env.update(
        CCSUP_TEST_RUN=os.environ["CCSUP_TEST_RUN"],
        CCSUP_STATE_DIR=str(state_dir),
        CCSUP_CONFIG=str(d.config),
        CCSUP_HOOK_LOG=str(tmp_path / "hook.log"),
    )
    go = tmp_path / "go"
    holder = subprocess.Popen(
        [*CCSUP, "run", "--", "sh", "-c", f"echo ready; while [ ! -e {go} ]; do sleep 0.05; done"],
        env=env,
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout.readline() == b"ready\n"
        mk = tmp_path / "queued.mk"
        mk.write_text("all:\n\t@echo queued-ran-in $$PWD\n")
        hooked = subprocess.run(
            [*CCSUP, "hook", "run", "claude"],
            input=claude_payload(f"make -s -f {mk}", str(tmp_path)),
            env=env,
            capture_output=True,
            timeout=60,
        )
        reason = json.loads(hooked.stdout)["hookSpecificOutput"]["permissionDecisionReason"]
        hint = reason.split("Run: ")[1].split(" (it waits")[0]
        assert hint.startswith(shlex.join([PYTHON, "-m", "supervisor", "--state-dir"])), hint
        go.write_text("")
        waited = subprocess.run(
            ["bash", "-lc", hint], env=login_shell_env(tmp_path), capture_output=True, timeout=60
        )
        assert waited.returncode == 0, waited.stderr
        assert f"queued-ran-in {tmp_path}".encode() in waited.stdout
        # and the hook approves exactly that line, not one quoted or spaced another way
        for line, expected in ((hint, "allow"), (hint.replace(" wait ", "  wait "), None)):
            answer = subprocess.run(
                [*CCSUP, "hook", "run", "claude"],
                input=claude_payload(line, str(tmp_path)),
                env=env,
                capture_output=True,
                timeout=60,
            )
            got = (json.loads(answer.stdout or b"{}").get("hookSpecificOutput") or {}).get(
                "permissionDecision"
            )
            assert got == expected, (line, answer.stdout)
    finally:
        go.write_text("")
        holder.wait(60)


def test_pass_env_gives_the_turn_the_environment_the_original_line_had_in_a_login_shell(
    daemon, state_dir, tmp_path
):
    """`--pass-env` hands the turn the environment of the shell that runs the rewritten line:
    the shell the original would have run in, a login shell's PATH included. Nothing is added or
    taken away: the command finds what it would have found."""
    d = daemon(caps="default = 1")
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "mytool").write_text("#!/bin/sh\necho mytool-found\n")
    (tools / "mytool").chmod(0o755)
    mk = tmp_path / "env.mk"
    mk.write_text("all:\n\t@echo PATH=$$PATH; mytool\n")
    env = login_shell_env(tmp_path) | {
        "CCSUP_STATE_DIR": str(state_dir),
        "CCSUP_CONFIG": str(d.config),
        "CCSUP_HOOK_LOG": str(tmp_path / "hook.log"),
    }
    # a profile that puts the tool on PATH, as a user's login shell does
    (tmp_path / "home" / ".bash_profile").write_text(f'export PATH="{tools}:$PATH"\n')
    original = f"make -s -f {mk}"
    hooked = subprocess.run(
        [*CCSUP, "hook", "run", "claude"],
        input=claude_payload(original, str(tmp_path)),
        env=env | {"PATH": os.environ["PATH"]},
        capture_output=True,
        timeout=60,
    )
    rewritten = json.loads(hooked.stdout)["hookSpecificOutput"]["updatedInput"]["command"]
    as_codex = {"env": env, "cwd": tmp_path, "capture_output": True, "timeout": 60}
    before = subprocess.run(["bash", "-lc", original], **as_codex)
    after = subprocess.run(["bash", "-lc", rewritten], **as_codex)
    assert before.returncode == 0 and b"mytool-found" in before.stdout, before
    assert (after.returncode, after.stdout) == (before.returncode, before.stdout)
