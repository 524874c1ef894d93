"""`ccsup mcp install|uninstall <harness>`: write ccsup's MCP server into a harness's own MCP
configuration, and remove exactly what was written.

The server entry names our interpreter by absolute path (`<python> -I -m supervisor --state-dir
<dir> [--config <file>] mcp`): no PATH, no activated venv, and `-I` keeps a `supervisor` folder
in the harness's working directory (or $PYTHONPATH) from shadowing ours. The state directory
(and the config file, when one was used) are the ones the installing command resolved, so the
server finds the same supervisor whatever the harness's environment holds. Each entry carries
the variable MARK_ENV = MARK, which is how ours is told from a user's server of the same name.

- Claude Code: `mcpServers.ccsup` (`{"type": "stdio", "command", "args", "env"}`) at the top
  of its user configuration, `$CLAUDE_CONFIG_DIR/.claude.json`, else `~/.claude.json` (what
  `claude mcp add --scope user` writes); `--settings FILE` for another file (a project's
  `.mcp.json` has the same `mcpServers` form).
- Codex: a `[mcp_servers.ccsup]` table (`command`, `args`, `env`, `required = true`,
  `startup_timeout_sec = 60`: see docs/agents.md) in `$CODEX_HOME/config.toml`,
  else `~/.codex/config.toml`. The file is TOML a user edits by hand, so it is never rewritten:
  our table is appended between two marker comments and removed with them, and the rest of
  the file (comments included) stays byte for byte.
- OpenCode: `mcp.ccsup` (`{"type": "local", "command": [...], "environment", "enabled"}`) in
  `$XDG_CONFIG_HOME/opencode/opencode.json`, else `~/.config/opencode/opencode.json`.

State: the harness's file, written atomically (supervisor.agents.install.write_atomic). Run
again: ours is replaced, everything else kept. A file that is not JSON (or TOML), or a server
named `ccsup` that we did not write: refused, naming it, and left as it is. Stopped half-way:
the old file or the new one.
"""

from __future__ import annotations

import json
import os
import sys
import tomllib
from pathlib import Path

from ..errors import CcsupError, UsageError
from .install import _read_json, _write_json, write_atomic

NAME = "ccsup"
MARK_ENV = "CCSUP_INSTALLED_BY"
MARK = "ccsup mcp install"
BEGIN = "# >>> ccsup mcp install: written by `ccsup mcp install codex`; removed by uninstall"
END = "# <<< ccsup mcp install"


def server_command(state_dir: Path, config: str | None) -> list[str]:
    """The MCP server's command line: absolute interpreter, isolated, state directory given."""
    words = [sys.executable, "-I", "-m", "supervisor", "--state-dir", str(state_dir)]
    if config is not None:
        words += ["--config", str(config)]
    return [*words, "mcp"]


def default_target(harness: str, env=os.environ) -> Path:
    home = Path(env.get("HOME") or os.path.expanduser("~"))
    if harness == "claude":
        if env.get("CLAUDE_CONFIG_DIR"):
            return Path(env["CLAUDE_CONFIG_DIR"]) / ".claude.json"
        return home / ".claude.json"
    if harness == "codex":
        base = Path(env["CODEX_HOME"]) if env.get("CODEX_HOME") else home / ".codex"
        return base / "config.toml"
    xdg = env.get("XDG_CONFIG_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else home / ".config"
    return base / "opencode" / "opencode.json"


def _entry(harness: str, words: list[str]) -> dict:
    if harness == "claude":
        return {"type": "stdio", "command": words[0], "args": words[1:], "env": {MARK_ENV: MARK}}
    return {"type": "local", "command": words, "environment": {MARK_ENV: MARK}, "enabled": True}


def _table(harness: str) -> str:
    return "mcpServers" if harness == "claude" else "mcp"


def _ours(entry: object) -> bool:
    if not isinstance(entry, dict):
        return False
    env = entry.get("env") if "env" in entry else entry.get("environment")
    return isinstance(env, dict) and env.get(MARK_ENV) == MARK


def install(harness: str, target: Path | None, state_dir: Path, config: str | None) -> Path:
    """Write ccsup's MCP server for `harness`; answers the file written."""
    words = server_command(state_dir, config)
    path = target or default_target(harness)
    if harness == "codex":
        _install_toml(path, words)
        return path
    data = _read_json(path)
    table = data.get(_table(harness), {})
    if not isinstance(table, dict):
        raise UsageError(f"{path}: {_table(harness)!r} is not an object; left as it is")
    if NAME in table and not _ours(table[NAME]):
        raise UsageError(
            f"{path}: {_table(harness)}.{NAME} is a server ccsup did not write; left as it is "
            "(remove it, or install into another file with --settings)"
        )
    _write_json(path, {**data, _table(harness): {**table, NAME: _entry(harness, words)}})
    return path


def uninstall(harness: str, target: Path | None) -> tuple[Path, bool]:
    """Remove what install wrote; answers (the file, whether there was anything to remove)."""
    path = target or default_target(harness)
    if not path.exists():
        return path, False
    if harness == "codex":
        return path, _uninstall_toml(path)
    data = _read_json(path)
    table = data.get(_table(harness))
    if not isinstance(table, dict) or not _ours(table.get(NAME)):
        return path, False
    kept = {name: entry for name, entry in table.items() if name != NAME}
    data = (
        {**data, _table(harness): kept}
        if kept
        else {k: v for k, v in data.items() if k != _table(harness)}
    )
    _write_json(path, data)
    return path, True


# -- Codex: a marked block in config.toml, the rest of the file untouched --------------------------


def _read_toml_text(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ""
    except (OSError, UnicodeDecodeError) as e:
        raise CcsupError(f"unable to read {path}: {getattr(e, 'strerror', None) or e}") from None
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{path} is not TOML ({e}); it was left as it is") from None
    return text


def _without_block(text: str) -> tuple[str, bool]:
    lines = text.splitlines(keepends=True)
    try:
        begin = next(i for i, line in enumerate(lines) if line.rstrip("\n") == BEGIN)
        end = next(i for i in range(begin, len(lines)) if lines[i].rstrip("\n") == END)
    except StopIteration:
        return text, False
    if begin > 0 and lines[begin - 1] == "\n":
        begin -= 1  # the blank line install put before the block
    return "".join(lines[:begin] + lines[end + 1 :]), True


def _toml_string(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)  # a JSON string is a TOML basic string


def _install_toml(path: Path, words: list[str]) -> None:
    text, _ = _without_block(_read_toml_text(path))
    servers = tomllib.loads(text).get("mcp_servers", {})
    if isinstance(servers, dict) and NAME in servers:
        raise UsageError(
            f"{path}: [mcp_servers.{NAME}] is a server ccsup did not write; left as it is "
            "(remove it, or install into another file with --settings)"
        )
    block = "\n".join(
        [
            BEGIN,
            f"[mcp_servers.{NAME}]",
            f"command = {_toml_string(words[0])}",
            f"args = [{', '.join(_toml_string(w) for w in words[1:])}]",
            f"env = {{ {MARK_ENV} = {_toml_string(MARK)} }}",
            "required = true",  # Codex offers a server still starting no tools in its turn
            "startup_timeout_sec = 60",
            END,
            "",
        ]
    )
    if text and not text.endswith("\n"):
        text += "\n"
    new = f"{text}\n{block}" if text.strip() else block
    tomllib.loads(new)  # what we write is TOML, or nothing is written
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, new.encode())


def _uninstall_toml(path: Path) -> bool:
    text = _read_toml_text(path)
    kept, found = _without_block(text)
    if not found:
        return False
    write_atomic(path, kept.encode())
    return True
