"""`ccsup hook doctor <harness>`: does the installed hook's rewrite take effect in this build?

Builds have dropped `updatedInput` silently (Claude Code issues 15897, 79321; Codex 46664), so
"installed" proves nothing. The doctor runs the harness itself, non-interactively, against a
scripted provider on 127.0.0.1 (supervisor.agents.scripted; nothing reaches a real provider)
whose model asks to run one canary command, `echo ccsup-canary-<nonce> turn=${CCSUP_TURN:-none}`
(a command holding `ccsup-canary` always matches the hook's rules). Inside a ccsup turn,
CCSUP_TURN is the turn's id: the tool result the harness sends back to the model says whether
the command ran as the rewrite or as the original. Verdicts:

- ok: the canary ran as turn <id> (and the history knows that turn);
- dropped: the hook answered, but the harness ran the original command (a build that drops
  rewrites: exit 1, loudly);
- not run: the harness never sent a tool result (it failed, or refused the command).

Needs: the hook installed (the harness's own settings, as the user runs it), a supervisor
running, and the harness's executable (`--bin`, else on PATH); `--harness-arg` adds arguments to
the harness's command line (e.g. Codex's `--dangerously-bypass-hook-trust` for a hook not yet
trusted in /hooks, and its `-s danger-full-access`). Supported: claude (`claude -p`, the Anthropic
Messages API through ANTHROPIC_BASE_URL), codex (`codex exec`, a custom model provider with
the Responses API, given by `-c` overrides) and opencode (`opencode run`, a custom provider,
`@ai-sdk/openai-compatible` on Chat Completions, in a config file named by $OPENCODE_CONFIG and
merged with the user's own; OpenCode installs that package from npm on first use).

State: none; the canary turn is an ordinary, finished turn in the history.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import uuid
from pathlib import Path

from ..errors import CcsupError, UsageError
from . import install as installer
from .rules import CANARY
from .scripted import ScriptedProvider

TIMEOUT = 120.0  # seconds the harness may take for the canary
SUPPORTED = ("claude", "codex", "opencode")


class Verdict:
    def __init__(self, ok: bool, lines: list[str]):
        self.ok = ok
        self.lines = lines


def _codex(
    executable: str, provider: ScriptedProvider, cwd: Path, extra: list[str]
) -> subprocess.CompletedProcess:
    name = "ccsup_doctor"
    overrides = {
        "model": '"scripted"',
        "model_provider": f'"{name}"',
        f"model_providers.{name}.name": '"ccsup doctor"',
        f"model_providers.{name}.base_url": f'"{provider.url}/v1"',
        f"model_providers.{name}.wire_api": '"responses"',
        f"model_providers.{name}.env_key": '"CCSUP_DOCTOR_KEY"',
    }
    args = [executable, "exec", "--skip-git-repo-check"]
    for key, value in overrides.items():
        args += ["-c", f"{key}={value}"]
    return subprocess.run(
        [*args, *extra, "ccsup doctor: run the canary"],
        cwd=cwd,
        env={**os.environ, "CCSUP_DOCTOR_KEY": "sk-ccsup-doctor-scripted"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def _opencode(
    executable: str, provider: ScriptedProvider, cwd: Path, extra: list[str]
) -> subprocess.CompletedProcess:
    import json
    import tempfile

    config = {
        "provider": {
            "ccsup_doctor": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "ccsup doctor",
                "options": {"baseURL": f"{provider.url}/v1", "apiKey": "sk-ccsup-doctor"},
                "models": {"scripted": {"name": "scripted", "tool_call": True}},
            }
        }
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="ccsup-doctor-") as f:
        json.dump(config, f)
        f.flush()
        return subprocess.run(
            [
                executable,
                "run",
                "ccsup doctor: run the canary",
                "--model",
                "ccsup_doctor/scripted",
                *extra,
            ],
            cwd=cwd,
            env={**os.environ, "OPENCODE_CONFIG": f.name, "PWD": str(cwd)},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )


def _claude(
    executable: str, provider: ScriptedProvider, cwd: Path, extra: list[str]
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    env.update(
        ANTHROPIC_BASE_URL=provider.url,
        ANTHROPIC_API_KEY="sk-ccsup-doctor-scripted",
        DISABLE_TELEMETRY="1",
        DISABLE_AUTOUPDATER="1",
        DISABLE_ERROR_REPORTING="1",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
    )
    return subprocess.run(
        [executable, "-p", "ccsup doctor: run the canary", "--output-format", "json", *extra],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def _claude_sandbox(settings: Path) -> str:
    """Whether the canary runs inside Claude Code's sandbox (these settings' `sandbox.enabled`)."""
    import json

    try:
        data = json.loads(settings.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = {}
    sandbox = data.get("sandbox") if isinstance(data, dict) else None
    if not isinstance(sandbox, dict) or not sandbox.get("enabled"):
        return f"Claude Code's sandbox: off in {settings} (the canary runs without it)"
    excluded = sandbox.get("excludedCommands") or []
    ours = any(isinstance(c, str) and " -m supervisor " in c for c in excluded)
    return f"Claude Code's sandbox: on in {settings}; the canary runs through it" + (
        "" if ours else " (no ccsup entry in sandbox.excludedCommands: reinstall the hook)"
    )


def doctor(
    harness: str, executable: str | None, settings: Path | None, client, extra: tuple[str, ...] = ()
) -> Verdict:
    if harness not in SUPPORTED:
        return Verdict(False, [f"{harness}: the doctor does not drive this harness yet"])
    lines = []
    command = installer.installed(harness, settings)
    if command is None:
        where = settings or installer.default_target(harness)
        return Verdict(False, [f"no ccsup hook in {where}: run `ccsup hook install {harness}`"])
    lines.append(f"hook installed: {command}")
    carried = installer.carried(command)
    lines.append(
        "hook's state directory: "
        + (
            f"{carried['--state-dir']} (carried by the hook)"
            if "--state-dir" in carried
            else f"found as the CLI finds it ($CCSUP_STATE_DIR, else the default): {client.state_dir} here"
        )
    )
    lines.append(
        "hook's config: "
        + (
            f"{carried['--config']} (carried by the hook)"
            if "--config" in carried
            else "found as the CLI finds it ($CCSUP_CONFIG, else $XDG_CONFIG_HOME/ccsup/ccsup.toml)"
        )
    )
    if "--state-dir" in carried and os.path.abspath(carried["--state-dir"]) != os.path.abspath(
        client.state_dir
    ):
        lines.append(
            f"warning: the hook uses {carried['--state-dir']}, this doctor {client.state_dir}"
        )
    if harness == "claude":
        lines.append(_claude_sandbox(settings or installer.default_target(harness)))
    if harness == "codex":
        from . import codex_sandbox

        lines += codex_sandbox.status((settings or installer.default_target(harness)).parent)
    client.check_running()
    found = executable or shutil.which(harness)
    if not found:
        raise UsageError(f"no {harness} executable on PATH; give it with --bin")
    version = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=60)
    lines.append(f"{harness}: {found} {version.stdout.strip()}")
    nonce = uuid.uuid4().hex[:12]
    canary = f"echo {CANARY}-{nonce} turn=$CCSUP_TURN"  # one plain command: approved
    if harness == "codex":
        provider = ScriptedProvider([("exec_command", {"cmd": canary})])
        drive = _codex
    elif harness == "opencode":
        provider = ScriptedProvider([("bash", {"command": canary, "description": "ccsup doctor"})])
        drive = _opencode
    else:
        provider = ScriptedProvider([("Bash", {"command": canary, "description": "ccsup doctor"})])
        drive = _claude
    try:
        done = drive(found, provider, Path.cwd(), list(extra))
    except subprocess.TimeoutExpired:
        provider.close()
        return Verdict(False, [*lines, f"not run: {harness} did not finish within {TIMEOUT:g} s"])
    provider.close()
    seen = [r for r in provider.results if f"{CANARY}-{nonce}" in r]
    if not seen:
        said = (done.stderr or done.stdout).strip()[-400:]
        told = provider.results[-1][:300] if provider.results else "nothing"
        return Verdict(
            False,
            [
                *lines,
                f"not run: the canary's output never reached the model (it saw: {told}); "
                f"{harness} exited {done.returncode}: {said}",
            ],
        )
    match = re.search(rf"{CANARY}-{nonce} turn=(\S+)", seen[0])
    turn = match.group(1) if match else "none"
    if turn == "none":
        return Verdict(
            False,
            [
                *lines,
                f"DROPPED: {harness} ran the canary as it was: this build ignores the hook's "
                "rewrite (updatedInput); heavy commands run outside ccsup",
            ],
        )
    try:
        from ..history import db

        known = db.show(client.state_dir, turn) is not None
    except CcsupError:
        known = False
    tail = "" if known else " (not yet in the history)"
    return Verdict(
        True, [*lines, f"ok: the rewrite took effect: the canary ran as turn {turn}{tail}"]
    )
