"""What agents type is recognised: the wrappers, multi-line commands, heredocs, quoted assignments
and shell bodies send their heavy command through ccsup; "already through ccsup" is the first word
of a simple command, nothing else. The real hook process, Claude Code's payload."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from conftest import PYTHON, ROOT

HOOK = [PYTHON, "-S", str(ROOT / "supervisor" / "agents" / "fast_hook.py"), "claude"]


def decision(command: str, env: dict) -> str:
    data = {
        "session_id": "sess-r",
        "cwd": "/tmp",
        "hook_event_name": "PreToolUse",
        "tool_name": "Bash",
        "tool_input": {"command": command},
    }
    done = subprocess.run(
        HOOK, input=json.dumps(data).encode(), env=env, capture_output=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    if not done.stdout.strip():
        return "pass"
    return json.loads(done.stdout)["hookSpecificOutput"]["permissionDecision"]


@pytest.fixture
def env(daemon, state_dir, tmp_path):
    d = daemon(caps="default = 500")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCSUP_")}
    env.update(
        CCSUP_TEST_RUN=os.environ["CCSUP_TEST_RUN"],
        CCSUP_HOOK_LOG=str(tmp_path / "hook.log"),
        XDG_CONFIG_HOME=str(tmp_path / "xdg"),
        CCSUP_STATE_DIR=str(state_dir),
        CCSUP_CONFIG=str(d.config),
    )
    return env


# (command, what Claude Code is answered): "allow" for one plain simple command, "ask" for a line
# of more than one (rewritten all the same: the heavy part runs capped once approved).
RECOGNISED = [
    ("echo first\npytest -x", "ask"),
    ("cat <<'EOF' > notes.txt\nplain text\nEOF\nmake test", "ask"),
    ('FOO="a b" make', "ask"),  # rewritten; an assignment off the safe list: the harness asks
    ('LANG="C.UTF-8" make', "allow"),
    ("timeout 60 pytest", "allow"),
    ("nice -n 10 make", "allow"),
    ("ionice -c 3 make -j2", "allow"),
    ("uv run pytest -q", "allow"),
    ("poetry run pytest", "allow"),
    ("pdm run pytest", "allow"),
    ("hatch run pytest", "allow"),
    ("npx jest --ci", "allow"),
    ('bash -c "pytest -q"', "allow"),
    ("sh -c 'cd sub && make'", "allow"),
    ("env X=1 pytest", "ask"),
    ("env CI=1 pytest", "allow"),
    ("command make", "allow"),
    ("exec make", "allow"),
    ("{ pytest; }", "ask"),
    ("(cd sub && make)", "ask"),
    ("if [ -f Makefile ]; then make; fi", "ask"),
    ("while true; do pytest -x && break; done", "ask"),
    ("for d in a b; do (cd $d && cargo test); done", "ask"),
    ("bash <<'EOF'\ncd sub\npytest\nEOF", "ask"),
    # the three lines once vetoed as "already through ccsup"
    ("pytest -m supervisor", "allow"),
    ("ccsup status; pytest", "ask"),
    ("make # python -m supervisor", "allow"),
]
PASSED = [
    "ccsup run -- pytest",
    f"{PYTHON} -m supervisor run --key k -- bash -c 'make'",
    "python3 -m supervisor wait abc",
    "echo pytest",
    "grep -rn make src | head",
    "cat <<'EOF'\npytest\nEOF",
    "command -v make",
    "git commit -m 'make it so'",
]


@pytest.mark.timeout(300)  # a hook process per line, on a busy machine
def test_what_agents_type_is_recognised_and_ccsup_only_as_a_first_word(env):
    wrong = {}
    for command, expected in RECOGNISED:
        got = decision(command, env)
        if got != expected:
            wrong[command] = got
    for command in PASSED:
        got = decision(command, env)
        if got != "pass":
            wrong[command] = got
    assert not wrong
