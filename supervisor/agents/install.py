"""`ccsup hook install|uninstall <harness>`: write the harness's hook configuration, and remove
exactly what was written.

- Claude Code: a PreToolUse group `{"matcher": "Bash", "hooks": [{"type": "command", "command":
  HOOK, "timeout": 30}]}` in settings.json (`--settings`, else $CLAUDE_CONFIG_DIR/settings.json,
  else ~/.claude/settings.json).
- Codex: the same group in hooks.json (`--settings`, else $CODEX_HOME/hooks.json, else
  ~/.codex/hooks.json). Codex runs a hook only once it is trusted (`/hooks` in the CLI). What
  Codex's sandbox needs, beside it: supervisor.agents.codex_sandbox.
- OpenCode: a plugin file, ccsup.js, in `--settings` (a folder), else
  $XDG_CONFIG_HOME/opencode/plugins/ (default ~/.config/opencode/plugins/): its
  `tool.execute.before` asks the hook and sets `output.args.command` or throws the refusal.

HOOK is the fast form: `<python> -S <package>/agents/fast_hook.py <harness> [--key K] [--match P]...
#ccsup-hook`; the trailing comment marks ours. Installing again replaces ours (new flags) and
keeps everything else; uninstalling removes our group, then a PreToolUse list and a hooks table
left empty by that. Other hooks, settings and formatting of values are kept (the JSON is written
back with two-space indents).

State: the harness's file, written atomically (temp file, fsync, rename). Run again: the same
file. A file that is not JSON (or not an object): refused, naming it, and left as it is. Stopped
half-way: the old file or the new one, never half of one.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

from ..errors import CcsupError, UsageError

MARK = "#ccsup-hook"
HARNESSES = ("claude", "codex", "opencode")
PLUGIN_NAME = "ccsup.js"


def hook_command(
    harness: str,
    key: str | None,
    match: tuple[str, ...] | list[str],
    state_dir: Path | None = None,
    config: Path | None = None,
) -> list[str]:
    """The fast form's words; `state_dir` and `config` (absolute) are carried when install was
    given them (--state-dir/--config or $CCSUP_STATE_DIR/$CCSUP_CONFIG): the harness's
    environment need not hold them. Without them the hook finds both as the CLI does."""
    script = Path(__file__).with_name("fast_hook.py")
    words = [sys.executable, "-S", str(script), harness]
    if key:
        words += ["--key", key]
    for pattern in match:
        words += ["--match", pattern]
    if state_dir is not None:
        words += ["--state-dir", str(state_dir)]
    if config is not None:
        words += ["--config", str(config)]
    return words


def carried(command: str) -> dict[str, str]:
    """The --state-dir and --config an installed hook carries ({} for neither): `command` is what
    `installed` answers (the command, or OpenCode's plugin file, whose HOOK holds the words)."""
    words: list[str] = []
    if command.endswith(PLUGIN_NAME) and os.path.isfile(command):
        for line in Path(command).read_text(encoding="utf-8").splitlines():
            if line.startswith("const HOOK = "):
                try:
                    words = json.loads(line[len("const HOOK = ") :].rstrip(";"))
                except ValueError:
                    return {}
    else:
        try:
            words = shlex.split(command, comments=True)
        except ValueError:
            return {}
    found = {}
    for flag, value in zip(words, words[1:], strict=False):
        if flag in ("--state-dir", "--config"):
            found[flag] = value
    return found


def default_target(harness: str, env=os.environ) -> Path:
    home = Path(env.get("HOME") or os.path.expanduser("~"))
    if harness == "claude":
        base = Path(env["CLAUDE_CONFIG_DIR"]) if env.get("CLAUDE_CONFIG_DIR") else home / ".claude"
        return base / "settings.json"
    if harness == "codex":
        base = Path(env["CODEX_HOME"]) if env.get("CODEX_HOME") else home / ".codex"
        return base / "hooks.json"
    xdg = env.get("XDG_CONFIG_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else home / ".config"
    return base / "opencode" / "plugins"


def write_atomic(path: Path, data: bytes) -> None:
    """Temp file, fsync, rename; the file keeps its mode (settings may hold secrets: 0600)."""
    try:
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError:
        mode = 0o644
    tmp = path.with_name(f".{path.name}.{os.getpid()}.ccsup.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as e:
        raise CcsupError(f"unable to write {path}: {e.strerror}") from None


def _read_json(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise CcsupError(f"unable to read {path}: {e.strerror}") from None
    if not text.strip():
        return {}
    try:
        data = json.loads(text)
    except ValueError as e:
        raise UsageError(f"{path} is not JSON ({e}); it was left as it is") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path} holds a JSON {type(data).__name__}, not an object; left as it is")
    return data


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, (json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode())


def _ours(group: object) -> bool:
    if not isinstance(group, dict):
        return False
    hooks = group.get("hooks")
    return isinstance(hooks, list) and any(
        isinstance(h, dict) and str(h.get("command", "")).endswith(MARK) for h in hooks
    )


def _without_ours(data: dict) -> dict:
    hooks = data.get("hooks")
    if not isinstance(hooks, dict) or not isinstance(hooks.get("PreToolUse"), list):
        return data
    kept = [g for g in hooks["PreToolUse"] if not _ours(g)]
    hooks = dict(hooks)
    if kept:
        hooks["PreToolUse"] = kept
    else:
        del hooks["PreToolUse"]
    data = dict(data)
    if hooks:
        data["hooks"] = hooks
    else:
        del data["hooks"]
    return data


def plugin_text(words: list[str]) -> str:
    return f"""// ccsup: every bash call asks `ccsup hook run opencode` first ({MARK}).
// Written by `ccsup hook install opencode`; `ccsup hook uninstall opencode` removes this file.
import {{ spawnSync }} from "node:child_process";

const HOOK = {json.dumps(words)};

export const CcsupHook = async ({{ directory }}) => ({{
  "tool.execute.before": async (input, output) => {{
    if (input.tool !== "bash") return;
    const payload = JSON.stringify({{
      tool: input.tool, sessionID: input.sessionID, callID: input.callID,
      args: output.args, directory,
    }});
    const answer = spawnSync(HOOK[0], HOOK.slice(1), {{ input: payload, encoding: "utf8", timeout: 30000 }});
    if (answer.status !== 0 || !answer.stdout || !answer.stdout.trim()) return;
    let said;
    try {{ said = JSON.parse(answer.stdout); }} catch {{ return; }}
    if (said.action === "rewrite" && typeof said.command === "string") output.args.command = said.command;
    else if (said.action === "refuse") throw new Error(said.message);
  }},
}});
"""


def _compile_hook() -> None:
    """The hook's modules as bytecode now: the hook runs before every shell command, and one
    compiled from source (no .pyc yet, or $PYTHONDONTWRITEBYTECODE) starts 5-10 ms slower."""
    import compileall

    compileall.compile_dir(str(Path(__file__).parent), maxlevels=0, quiet=2)


def sandbox_entries(ccsup: list[str], sockets: list[str]) -> dict:
    """What Claude Code's sandbox needs for a hooked command to reach the supervisor:
    `network.allowUnixSockets` (the control and bus sockets; macOS only, Claude Code's schema
    says: Linux's seccomp cannot filter by path) and an `excludedCommands` entry, our rewrite's
    start followed by ` *` (Linux: the `ccsup run` client runs outside the sandbox, as the turn
    it starts always does). Never `allowAllUnixSockets`: that would open every socket on the
    machine (a Docker socket among them) to every sandboxed command."""
    return {
        "network": {"allowUnixSockets": sockets},
        "excludedCommands": [f"{shlex.join([*ccsup, 'run'])} *"],
    }


def _with_sandbox(data: dict, entries: dict) -> dict:
    sandbox = data.get("sandbox", {})
    if not isinstance(sandbox, dict):
        raise UsageError("'sandbox' in the settings is not an object; left as it is")
    sandbox = dict(sandbox)
    network = dict(sandbox.get("network") or {})
    have = list(network.get("allowUnixSockets") or [])
    network["allowUnixSockets"] = have + [
        p for p in entries["network"]["allowUnixSockets"] if p not in have
    ]
    sandbox["network"] = network
    excluded = list(sandbox.get("excludedCommands") or [])
    sandbox["excludedCommands"] = excluded + [
        c for c in entries["excludedCommands"] if c not in excluded
    ]
    return {**data, "sandbox": sandbox}


def _without_sandbox(data: dict, entries: dict) -> dict:
    sandbox = data.get("sandbox")
    if not isinstance(sandbox, dict):
        return data
    sandbox = dict(sandbox)
    network = dict(sandbox.get("network") or {})
    ours = set(entries["network"]["allowUnixSockets"])
    kept = [p for p in network.get("allowUnixSockets") or [] if p not in ours]
    if kept:
        network["allowUnixSockets"] = kept
    else:
        network.pop("allowUnixSockets", None)
    if network:
        sandbox["network"] = network
    else:
        sandbox.pop("network", None)
    excluded = [
        c for c in sandbox.get("excludedCommands") or [] if c not in entries["excludedCommands"]
    ]
    if excluded:
        sandbox["excludedCommands"] = excluded
    else:
        sandbox.pop("excludedCommands", None)
    data = dict(data)
    if sandbox:
        data["sandbox"] = sandbox
    else:
        del data["sandbox"]
    return data


def install(
    harness: str,
    target: Path | None,
    key: str | None,
    match: tuple[str, ...] | list[str],
    state_dir: Path | None = None,
    config: Path | None = None,
    sandbox: dict | None = None,
) -> Path:
    """Write the hook for `harness` (and, for Claude Code, `sandbox`: sandbox_entries); answers
    the file written."""
    _compile_hook()
    words = hook_command(harness, key, match, state_dir, config)
    if harness == "opencode":
        folder = target or default_target(harness)
        path = folder / PLUGIN_NAME
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(path, plugin_text(words).encode())
        return path
    path = target or default_target(harness)
    data = _without_ours(_read_json(path))
    command = f"{shlex.join(words)} {MARK}"
    group = {"matcher": "Bash", "hooks": [{"type": "command", "command": command, "timeout": 30}]}
    hooks = dict(data.get("hooks") or {})
    if not isinstance(data.get("hooks", {}), dict):
        raise UsageError(f"{path}: 'hooks' is not an object; left as it is")
    pre = hooks.get("PreToolUse", [])
    if not isinstance(pre, list):
        raise UsageError(f"{path}: hooks.PreToolUse is not a list; left as it is")
    hooks["PreToolUse"] = [*pre, group]
    data = {**data, "hooks": hooks}
    if sandbox is not None and harness == "claude":
        data = _with_sandbox(data, sandbox)
    _write_json(path, data)
    return path


def uninstall(harness: str, target: Path | None, sandbox: dict | None = None) -> tuple[Path, bool]:
    """Remove what install wrote (and the `sandbox` entries it added); answers (the file,
    whether there was anything to remove)."""
    if harness == "opencode":
        path = (target or default_target(harness)) / PLUGIN_NAME
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return path, False
        if MARK not in text:
            raise UsageError(f"{path} was not written by ccsup (no {MARK} in it); left as it is")
        path.unlink()
        return path, True
    path = target or default_target(harness)
    if not path.exists():
        return path, False
    data = _read_json(path)
    kept = _without_ours(data)
    if sandbox is not None and harness == "claude":
        kept = _without_sandbox(kept, sandbox)
    if kept == data:
        return path, False
    _write_json(path, kept)
    return path, True


def installed(harness: str, target: Path | None) -> str | None:
    """The hook command installed for `harness` (None when there is none)."""
    if harness == "opencode":
        path = (target or default_target(harness)) / PLUGIN_NAME
        return str(path) if path.exists() and MARK in path.read_text(encoding="utf-8") else None
    path = target or default_target(harness)
    data = _read_json(path) if path.exists() else {}
    for group in (data.get("hooks") or {}).get("PreToolUse") or []:
        if _ours(group):
            return next(
                h["command"] for h in group["hooks"] if str(h.get("command", "")).endswith(MARK)
            )
    return None
