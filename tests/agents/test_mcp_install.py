"""`ccsup mcp install|uninstall claude|codex|opencode`: the harness's own MCP configuration gets
our server by absolute path with the state directory, the real harness lists it (connected, with
no ccsup and no venv on PATH), a user's other servers stay, and uninstall removes exactly ours."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from conftest import PYTHON
from npm_harness import harness_bin

CCSUP = [PYTHON, "-m", "supervisor"]

OTHER_TOML = """# my codex settings
model = "o3"  # a comment that must survive

[mcp_servers.docs]
command = "docs-server"
args = ["--port", "1"]
"""


def ccsup(home, state_dir, *args) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CCSUP_", "CODEX_", "XDG_"))}
    env.update(HOME=str(home), CLAUDE_CONFIG_DIR="")
    env.pop("CLAUDE_CONFIG_DIR")
    return subprocess.run(
        [*CCSUP, "--state-dir", str(state_dir), "mcp", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )


def bare_env(home) -> dict[str, str]:
    """What a harness started from a login shell has: no venv, no ccsup on PATH."""
    node = shutil.which("node")
    path = "/usr/bin:/bin" + (f":{os.path.dirname(node)}" if node else "")
    return {"HOME": str(home), "PATH": path, "LANG": "C.UTF-8"}


def listed(harness: str, home) -> str:
    done = subprocess.run(
        [str(harness_bin(harness)), "mcp", "list"],
        capture_output=True,
        text=True,
        timeout=120,
        env=bare_env(home),
        cwd=home,
    )
    return done.stdout + done.stderr


def servers(harness: str, path) -> dict:
    if harness == "codex":
        import tomllib

        return tomllib.loads(path.read_text()).get("mcp_servers", {})
    return json.loads(path.read_text())["mcpServers" if harness == "claude" else "mcp"]


def seed(home, harness: str) -> tuple[os.PathLike, bytes]:
    if harness == "claude":
        path = home / ".claude.json"
        data = {"numStartups": 3, "mcpServers": {"docs": {"command": "docs-server", "args": []}}}
        text = json.dumps(data, indent=2) + "\n"
    elif harness == "codex":
        path = home / ".codex" / "config.toml"
        text = OTHER_TOML
    else:
        path = home / ".config" / "opencode" / "opencode.json"
        data = {"mcp": {"docs": {"type": "local", "command": ["docs-server"], "enabled": False}}}
        text = json.dumps(data, indent=2) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path, text.encode()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("harness", ["claude", "codex", "opencode"])
def test_install_is_listed_by_the_real_harness_and_uninstall_restores_the_file(
    harness, tmp_path, state_dir
):
    home = tmp_path / "home"
    home.mkdir()
    path, before = seed(home, harness)
    done = ccsup(home, state_dir, "install", harness)
    assert done.returncode == 0, done.stderr
    assert str(path) in done.stdout
    text = path.read_text()
    assert PYTHON in text and str(state_dir) in text and "docs" in text

    shown = listed(harness, home)
    line = next((x for x in shown.splitlines() if "ccsup" in x), "")
    assert PYTHON in line or PYTHON in shown, shown
    assert "docs" in shown, shown  # the user's server is still there
    if harness in ("claude", "opencode"):  # these two start it to say so
        assert "onnected" in line or "connected" in shown.split("ccsup", 1)[1][:200], shown

    installed = servers(harness, path)
    again = ccsup(home, state_dir, "install", harness)  # twice: one entry, replaced
    assert again.returncode == 0, again.stderr
    assert servers(harness, path) == installed

    gone = ccsup(home, state_dir, "uninstall", harness)
    assert gone.returncode == 0 and "removed" in gone.stdout, gone
    if harness == "codex":
        assert path.read_bytes() == before  # byte for byte, comments included
    else:  # the harness keeps its own state in the file too: ours alone is gone
        now, then = json.loads(path.read_bytes()), json.loads(before)
        assert servers(harness, path) == {k: v for k, v in installed.items() if k != "ccsup"}
        assert all(now[k] == v for k, v in then.items()), (now, then)
    nothing = ccsup(home, state_dir, "uninstall", harness)
    assert nothing.returncode == 0 and "no ccsup MCP server" in nothing.stdout


@pytest.mark.parametrize("harness", ["claude", "codex", "opencode"])
def test_a_server_named_ccsup_that_we_did_not_write_and_a_broken_file_are_left_alone(
    harness, tmp_path, state_dir
):
    home = tmp_path / "home"
    home.mkdir()
    path, _ = seed(home, harness)
    if harness == "codex":
        path.write_text(OTHER_TOML + '\n[mcp_servers.ccsup]\ncommand = "mine"\n')
    else:
        data = json.loads(path.read_text())
        table = "mcpServers" if harness == "claude" else "mcp"
        data[table]["ccsup"] = {"command": "mine"}
        path.write_text(json.dumps(data))
    mine = path.read_bytes()
    done = ccsup(home, state_dir, "install", harness)
    assert done.returncode == 2 and "did not write" in done.stderr, done
    assert ccsup(home, state_dir, "uninstall", harness).returncode == 0
    assert path.read_bytes() == mine

    path.write_text("{not json" if harness != "codex" else "[broken\n")
    broken = ccsup(home, state_dir, "install", harness)
    assert broken.returncode == 2 and str(path) in broken.stderr, broken
    assert path.read_text() in ("{not json", "[broken\n")
