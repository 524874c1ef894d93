"""Codex itself (the npm package, pinned), against a scripted Responses API provider on
127.0.0.1 (a custom model provider in its config.toml): with `ccsup hook install codex` its
exec_command calls run as ccsup turns; through `ccsup mcp` (`[mcp_servers.ccsup]`, required) its
model calls run, then wait."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess

import pytest
from conftest import PYTHON, wait_until
from harness_sandbox import (
    CCSUP,
    QUEUED,
    AtOnce,
    install_hook,
    make_sandbox,
    mcp_answer,
    mcp_env,
    ran_then_waited,
    run_all,
    setsid_daemon,
    then_wait,
)
from npm_harness import PINNED, harness_bin, plain_make, process_gone

from supervisor.agents.scripted import ScriptedProvider
from supervisor.history import db


@pytest.fixture(scope="module")
def codex():
    return harness_bin("codex")


@pytest.fixture
def sandbox(daemon, state_dir, tmp_path):
    box = make_sandbox(daemon, state_dir, tmp_path, strip=("OPENAI", "CODEX"))
    (box["home"] / ".codex").mkdir()
    box["hooks"] = box["home"] / ".codex" / "hooks.json"
    box["env"].update(CODEX_HOME=str(box["home"] / ".codex"), SCRIPTED_KEY="sk-scripted")
    return box


def provider_config(home, provider: ScriptedProvider) -> None:
    (home / ".codex" / "config.toml").write_text(
        'model = "scripted"\nmodel_provider = "scripted"\n[model_providers.scripted]\n'
        f'name = "scripted"\nbase_url = "{provider.url}/v1"\nwire_api = "responses"\n'
        'env_key = "SCRIPTED_KEY"\n'
    )


def codex_exec(codex, *extra: str) -> list[str]:
    """`codex exec` with full access, trusting the installed hook, `extra` options before the
    prompt."""
    return [
        str(codex),
        "exec",
        "--skip-git-repo-check",
        "--dangerously-bypass-hook-trust",
        *extra,
        "-s",
        "danger-full-access",
        "run it",
    ]


def run_codex(codex, sandbox, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        codex_exec(codex, *extra),
        cwd=sandbox["work"],
        env=sandbox["env"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_an_exec_command_runs_as_a_turn_with_the_session_and_its_setsid_daemon_ends_with_it(
    codex, sandbox
):
    install_hook("codex", sandbox["hooks"], sandbox["env"])
    command, pidfile = setsid_daemon(sandbox["tmp"])
    provider = ScriptedProvider([("exec_command", {"cmd": command})])
    provider_config(sandbox["home"], provider)
    daemon_pid = None
    try:
        ran = run_codex(codex, sandbox)
        assert ran.returncode == 0, ran.stderr[-2000:]
        daemon_pid = int(pidfile.read_text())
        [seen] = provider.results
        match = re.search(r"turn=(\S+) in (\S+)", seen)
        assert match and match.group(1) != "none", seen
        assert match.group(2) == str(sandbox["work"])
        session = re.search(r"session id: (\S+)", ran.stderr).group(1)
        turn = db.show(sandbox["state_dir"], match.group(1))
        assert (turn["holder"]["session"], turn["holder"]["harness"]) == (session, "codex")
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


@pytest.mark.timeout(240)
def test_a_plain_command_runs_capped_and_a_hostile_line_is_not_approved(codex, sandbox):
    """Codex 0.171 refuses `approval_policy = "untrusted"` ("no longer supported"), so this runs
    `on-request` with full access: Codex asks only when the model asks to escalate (its own
    sandbox: test_in_codex_own_sandbox_a_hooked_command_runs_as_a_turn). The plain hooked command runs as a turn; the line with a hostile part is
    refused by the hook (Codex applies a rewrite only with "allow", so ccsup never rewrites it)
    with how to run the heavy part alone, and its marker is never made."""
    hooks = sandbox["hooks"]
    install_hook("codex", hooks, sandbox["env"])
    marker = sandbox["tmp"] / "PWNED"
    plain = plain_make(sandbox["tmp"], "plain", "echo turn=${CCSUP_TURN:-none}")
    provider = ScriptedProvider(
        [
            ("exec_command", {"cmd": plain}),
            ("exec_command", {"cmd": f"{plain}; touch {marker}"}),
        ]
    )
    provider_config(sandbox["home"], provider)
    try:
        ran = run_codex(codex, sandbox, "-c", 'approval_policy="on-request"')
    finally:
        provider.close()
    said = "\n".join(line for line in ran.stderr.splitlines() if "<unknown>" not in line)
    assert len(provider.results) == 2, (provider.results, said[-3000:])
    first, second = provider.results
    turn = re.search(r"turn=(\S+)", first)
    assert turn and turn.group(1) != "none", first
    assert not marker.exists(), second
    assert "on its own" in second, second


def test_versions_are_the_pinned_ones(codex):
    out = subprocess.run([str(codex), "--version"], capture_output=True, text=True, timeout=60)
    assert out.stdout.split()[-1] == PINNED["codex"][1]


def test_the_doctor_says_the_rewrite_took_effect_in_codex(codex, sandbox):
    hooks = sandbox["hooks"]
    install_hook("codex", hooks, sandbox["env"])

    def doctor(*extra):
        args = [*CCSUP, "hook", "doctor", "codex", "--bin", str(codex), "--settings", str(hooks)]
        for arg in ("-s", "danger-full-access", *extra):
            args.append(f"--harness-arg={arg}")
        return subprocess.run(
            args,
            cwd=sandbox["work"],
            env=sandbox["env"],
            capture_output=True,
            text=True,
            timeout=150,
        )

    untrusted = doctor()  # a hook nobody trusted in /hooks does not run: said loudly
    assert untrusted.returncode == 1 and "DROPPED" in untrusted.stdout, (
        untrusted.stdout + untrusted.stderr
    )
    ok = doctor("--dangerously-bypass-hook-trust")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "ok: the rewrite took effect" in ok.stdout and PINNED["codex"][1] in ok.stdout


def test_three_codex_sessions_on_a_cap_1_key_never_run_two_commands_at_once(codex, sandbox):
    """Also the case of a user whose ccsup lives only in a virtualenv: Codex's PATH holds no
    `ccsup`, and a queued session's `wait` line (the one the hook printed, naming the venv's
    Python) still runs and prints the command's output. Codex 0.171.0 runs an exec_command as
    `/bin/bash -c <cmd>`, not as a login shell (a scripted exec_command printing
    /proc/$$/cmdline and `shopt login_shell` saw `/bin/bash -c …` and `login_shell off`, with
    and without `login: true` in the call), so no profile script can add ccsup to it either."""
    install_hook("codex", sandbox["hooks"], sandbox["env"])
    path = os.pathsep.join(
        d
        for d in sandbox["env"]["PATH"].split(os.pathsep)
        if not shutil.which("ccsup", path=d or ".")
    )
    env = {**sandbox["env"], "PATH": path}
    assert shutil.which("ccsup", path=path) is None
    at_once = AtOnce(sandbox["tmp"])
    waited: dict[str, str] = {}  # a queued session's first answer -> what its wait line printed

    def after_wait(results):
        if QUEUED.search(results[0]):
            waited[results[0]] = results[1]
        return None  # then the model says it is done

    provider = ScriptedProvider(
        [("exec_command", {"cmd": at_once.command}), then_wait("exec_command", "cmd"), after_wait]
    )
    provider_config(sandbox["home"], provider)
    try:
        with at_once:
            procs = [
                subprocess.Popen(
                    codex_exec(codex),
                    cwd=sandbox["work"],
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                for _ in range(3)
            ]
            outs = run_all(procs, 150)
    finally:
        provider.close()
    assert all(p.returncode == 0 for p in procs), [o[1][-500:] for o in outs]
    assert at_once.most == 1, provider.results
    turns = wait_until(
        lambda: len(db.query(sandbox["state_dir"])) == 3 and db.query(sandbox["state_dir"]),
        15,
        0.1,
        "three turns in the history",
    )
    assert {t["outcome"] for t in turns} == {"ok"}
    sessions = {re.search(r"session id: (\S+)", o[1]).group(1) for o in outs}
    assert {t["holder"]["session"] for t in turns} == sessions
    assert sum("Output:\nran" in r for r in provider.results) == 3, provider.results
    assert any(
        "Command blocked by PreToolUse hook: ccsup: the machine is busy: your command is queued as"
        in r
        for r in provider.results
    )
    # each queued session ran the wait line it was given (no ccsup on its PATH): it printed the
    # command's output and its status
    queued = [r for r in provider.results if QUEUED.search(r)]
    assert queued and len(waited) == len(queued), (queued, waited)
    assert all("exited with code 0" in w and "Output:\nran" in w for w in waited.values()), waited


@pytest.mark.timeout(240)
def test_through_mcp_the_model_calls_run_then_wait(codex, sandbox):
    env_lines = "".join(f"{k} = {json.dumps(v)}\n" for k, v in mcp_env(sandbox["env"]).items())
    provider = ScriptedProvider([])

    def wait_for(results):
        return ("mcp__ccsup__wait", {"id": mcp_answer(results[0])["id"]})

    provider.steps = [
        ("mcp__ccsup__run", {"command": "sleep 2; echo via-mcp"}),
        wait_for,
        wait_for,
        wait_for,
    ]
    provider_config(sandbox["home"], provider)
    with (sandbox["home"] / ".codex" / "config.toml").open("a") as config:
        # Codex gives an optional MCP server one second to start before a turn, then leaves its
        # tools out of that turn (`ccsup mcp` takes 1-3 s here): `required` makes the turn wait.
        config.write(
            f"[mcp_servers.ccsup]\ncommand = {json.dumps(PYTHON)}\n"
            'args = ["-m", "supervisor", "mcp"]\nrequired = true\nstartup_timeout_sec = 60\n'
            f"[mcp_servers.ccsup.env]\n{env_lines}"
        )
    try:
        ran = run_codex(codex, sandbox)
    finally:
        provider.close()
    assert ran.returncode == 0, ran.stderr[-2000:]
    offered = [[t.get("name") for t in r.get("tools") or []] for r in provider.requests]
    ran_then_waited(provider, offered)
    [turn] = db.query(sandbox["state_dir"])  # run once, waited on by id
    # Codex passes the server no CODEX_THREAD_ID: the label is its MCP client name
    assert turn["outcome"] == "ok" and turn["holder"]["harness"] == "codex-mcp-client", turn


@pytest.mark.timeout(240)
def test_in_codex_own_sandbox_a_hooked_command_runs_as_a_turn(codex, sandbox):
    """Codex's sandbox (bubblewrap + seccomp) around the command, in the permission profile
    `hook install` makes from `:workspace`. Codex refuses to make its `codex-linux-sandbox` alias
    when CODEX_HOME is under the temporary folder ($TMPDIR, else /tmp), and bubblewrap then fails
    to exec it: TMPDIR is a folder of the test's own. The hooked command reaches the supervisor
    through the rule install writes; a plain command in the same session is still sandboxed: its
    connect(2) to the same control socket is refused (Codex's seccomp filter refuses every connect
    while the profile's network is off, the profile's unix_sockets entries notwithstanding); and
    the rule's words typed by the model itself are refused by the hook, their command never run."""
    config = sandbox["home"] / ".codex" / "config.toml"
    plain = plain_make(sandbox["tmp"], "inbox", "echo turn=${CCSUP_TURN:-none}")
    control = sandbox["state_dir"] / "control"
    probe = (
        "import socket; s = socket.socket(socket.AF_UNIX)\n"
        f"try:\n    s.connect({str(control)!r}); print('connected')\n"
        "except OSError as e:\n    print('refused', e)"
    )
    escaped = sandbox["tmp"] / "escaped"  # outside the workspace: the sandbox keeps it unwritten

    def forged(results):
        # what the rule lets run outside the sandbox unasked, typed by the model itself
        rule = (config.parent / "rules" / "ccsup.rules").read_text()
        prefix = json.loads(re.search(r"pattern=(\[.*?\])", rule).group(1))
        return ("exec_command", {"cmd": shlex.join([*prefix, "--", "touch", str(escaped)])})

    provider = ScriptedProvider(
        [
            ("exec_command", {"cmd": plain}),
            ("exec_command", {"cmd": f"python3 -c {shlex.quote(probe)}"}),
            forged,
        ]
    )
    provider_config(sandbox["home"], provider)
    config.write_text('default_permissions = ":workspace"\n' + config.read_text())
    done = subprocess.run(
        [*CCSUP, "hook", "install", "codex", "--settings", str(config.with_name("hooks.json"))],
        env=sandbox["env"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0 and "'ccsup' extends :workspace" in done.stdout, done.stdout
    tmpdir = sandbox["tmp"] / "tmpdir"
    tmpdir.mkdir()
    try:
        ran = subprocess.run(
            [str(codex), "exec", "--skip-git-repo-check", "--dangerously-bypass-hook-trust", "go"],
            cwd=sandbox["work"],
            env={**sandbox["env"], "TMPDIR": str(tmpdir)},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=150,
        )
    finally:
        provider.close()
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert "could not create PATH aliases" not in ran.stderr, ran.stderr[-2000:]
    assert len(provider.results) == 3, (provider.results, ran.stderr[-2000:])
    first, second, third = provider.results
    assert "run the command itself" in third and not escaped.exists(), third
    turn = re.search(r"turn=(\S+)", first)
    assert turn and turn.group(1) != "none", first
    assert db.show(sandbox["state_dir"], turn.group(1))["outcome"] == "ok"
    assert control.exists() and "refused [Errno 1] Operation not permitted" in second, second
    doctor = subprocess.run(
        [
            *CCSUP,
            "hook",
            "doctor",
            "codex",
            "--bin",
            str(codex),
            "--settings",
            str(config.with_name("hooks.json")),
            "--harness-arg=--dangerously-bypass-hook-trust",
        ],
        cwd=sandbox["work"],
        env={**sandbox["env"], "TMPDIR": str(tmpdir)},
        capture_output=True,
        text=True,
        timeout=150,
    )
    said = doctor.stdout + doctor.stderr
    assert doctor.returncode == 0 and "ok: the rewrite took effect" in said, said
    assert "default_permissions is our profile 'ccsup'" in said and "ccsup.rules" in said, said
    assert "under the temporary folder" not in said, said
