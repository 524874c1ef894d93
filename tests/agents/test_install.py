"""`ccsup hook install|uninstall`: each harness's file gets our hook, keeps everything else, and
uninstall removes exactly what install wrote."""

from __future__ import annotations

import json
import os
import subprocess

from conftest import PYTHON

CCSUP = [PYTHON, "-m", "supervisor"]


def ccsup(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([*CCSUP, *args], capture_output=True, text=True, timeout=30, env=env)


OTHER = {
    "model": "x",
    "hooks": {
        "PreToolUse": [{"matcher": "Edit", "hooks": [{"type": "command", "command": "lint"}]}],
        "Stop": [{"hooks": [{"type": "command", "command": "bye"}]}],
    },
}


def test_claude_and_codex_install_keeps_other_hooks_and_uninstall_restores_the_file(tmp_path):
    for harness in ("claude", "codex"):
        path = tmp_path / f"{harness}.json"
        path.write_text(json.dumps(OTHER))
        os.chmod(path, 0o600)
        done = ccsup(
            "hook", "install", harness, "--settings", str(path), "--key", "k1", "--match", "^make"
        )
        assert done.returncode == 0, done.stderr
        again = ccsup("hook", "install", harness, "--settings", str(path), "--key", "k2")
        assert again.returncode == 0, again.stderr
        data = json.loads(path.read_text())
        groups = data["hooks"]["PreToolUse"]
        assert (
            groups[0] == OTHER["hooks"]["PreToolUse"][0] and len(groups) == 2
        )  # replaced, not added
        ours = groups[1]
        assert ours["matcher"] == "Bash" and ours["hooks"][0]["type"] == "command"
        command = ours["hooks"][0]["command"]
        assert f"fast_hook.py {harness} --key k2" in command and command.endswith("#ccsup-hook")
        assert "^make" not in command
        assert data["hooks"]["Stop"] == OTHER["hooks"]["Stop"] and data["model"] == "x"
        assert os.stat(path).st_mode & 0o777 == 0o600
        removed = ccsup("hook", "uninstall", harness, "--settings", str(path))
        assert removed.returncode == 0 and "removed" in removed.stdout
        assert json.loads(path.read_text()) == OTHER
        nothing = ccsup("hook", "uninstall", harness, "--settings", str(path))
        assert nothing.returncode == 0 and "no ccsup hook" in nothing.stdout


def test_install_into_a_new_file_and_uninstall_leaves_no_hooks_table(tmp_path):
    path = tmp_path / "new" / "settings.json"
    assert ccsup("hook", "install", "claude", "--settings", str(path)).returncode == 0
    assert "PreToolUse" in json.loads(path.read_text())["hooks"]
    assert ccsup("hook", "uninstall", "claude", "--settings", str(path)).returncode == 0
    assert json.loads(path.read_text()) == {}


def test_a_file_that_is_not_json_is_refused_and_left_as_it_is(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text("{not json")
    done = ccsup("hook", "install", "claude", "--settings", str(path))
    assert done.returncode == 2 and "is not JSON" in done.stderr and str(path) in done.stderr
    assert path.read_text() == "{not json"
    bad_key = ccsup("hook", "install", "claude", "--settings", str(path), "--key", "_x")
    assert bad_key.returncode == 2 and "reserved" in bad_key.stderr
    bad_rule = ccsup("hook", "install", "claude", "--settings", str(path), "--match", "(")
    assert bad_rule.returncode == 2 and "not a regular expression" in bad_rule.stderr


def test_opencode_gets_a_plugin_file_that_node_can_load_and_uninstall_removes_it(tmp_path):
    folder = tmp_path / "plugins"
    assert (
        ccsup("hook", "install", "opencode", "--settings", str(folder), "--key", "oc").returncode
        == 0
    )
    plugin = folder / "ccsup.js"
    text = plugin.read_text()
    assert "tool.execute.before" in text and "#ccsup-hook" in text and '"--key", "oc"' in text
    node = subprocess.run(["node", "--version"], capture_output=True)
    if node.returncode == 0:  # the module parses and exports the plugin
        check = subprocess.run(
            [
                "node",
                "--input-type=module",
                "-e",
                f"import('{plugin}').then(m => console.log(typeof m.CcsupHook))",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert check.stdout.strip() == "function", check.stderr
    other = folder / "mine.js"
    other.write_text("// not ours")
    assert ccsup("hook", "uninstall", "opencode", "--settings", str(folder)).returncode == 0
    assert not plugin.exists() and other.exists()
