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


def _codex_env(tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CODEX", "CCSUP_"))}
    env["CCSUP_STATE_DIR"] = str(tmp_path / "state")
    return env


def _install_codex(folder, env) -> subprocess.CompletedProcess:
    return ccsup("hook", "install", "codex", "--settings", str(folder / "hooks.json"), env=env)


def _uninstall_codex(folder, env) -> subprocess.CompletedProcess:
    return ccsup("hook", "uninstall", "codex", "--settings", str(folder / "hooks.json"), env=env)


def _sockets(tmp_path) -> dict:
    state = tmp_path / "state"
    return {str(state / name): "allow" for name in ("control", "bus-in", "bus-out")}


def test_codex_own_profile_gets_only_our_sockets_and_uninstall_restores_the_bytes(tmp_path):
    import tomllib

    folder = tmp_path / "codex"
    folder.mkdir()
    config = folder / "config.toml"
    original = (
        '# mine\nmodel = "o3"\ndefault_permissions = "mine"\n\n[permissions.mine]\n'
        'extends = ":workspace"\n\n[permissions.mine.network.unix_sockets]\n'
        '"/run/mine.sock" = "allow"\n'
    )
    config.write_text(original)
    env = _codex_env(tmp_path)
    for _ in range(2):  # installing again changes nothing more
        done = _install_codex(folder, env)
        assert done.returncode == 0, done.stderr
        assert "added to your profile 'mine'" in done.stdout, done.stdout
    data = tomllib.loads(config.read_text())
    assert data["default_permissions"] == "mine" and data["model"] == "o3"
    assert data["permissions"] == {
        "mine": {
            "extends": ":workspace",
            "network": {"unix_sockets": {"/run/mine.sock": "allow", **_sockets(tmp_path)}},
        }
    }
    rule = (folder / "rules" / "ccsup.rules").read_text()
    assert '"-m", "supervisor", "--state-dir", ' in rule and '"run"], decision="allow")' in rule
    removed = _uninstall_codex(folder, env)
    assert removed.returncode == 0 and "removed" in removed.stdout, removed.stdout
    assert config.read_text() == original
    assert not (folder / "rules" / "ccsup.rules").exists()
    assert not (folder / "ccsup-hook.json").exists()


def test_codex_built_in_gets_a_profile_of_ours_that_extends_it_and_uninstall_restores(tmp_path):
    import tomllib

    env = _codex_env(tmp_path)
    for built_in in (":workspace", ":read-only"):
        folder = tmp_path / built_in[1:]
        folder.mkdir()
        config = folder / "config.toml"
        original = f'default_permissions = "{built_in}"  # kept\n[tui]\ntheme = "dark"\n'
        config.write_text(original)
        done = _install_codex(folder, env)
        assert done.returncode == 0, done.stderr
        assert f"'ccsup' extends {built_in} with only our sockets" in done.stdout, done.stdout
        data = tomllib.loads(config.read_text())
        assert data["default_permissions"] == "ccsup" and data["tui"] == {"theme": "dark"}
        assert data["permissions"] == {
            "ccsup": {"extends": built_in, "network": {"unix_sockets": _sockets(tmp_path)}}
        }
        assert _uninstall_codex(folder, env).returncode == 0
        assert config.read_text() == original


def test_codex_config_edited_after_install_keeps_the_edit_and_loses_only_ours(tmp_path):
    import tomllib

    folder = tmp_path / "codex"
    folder.mkdir()
    config = folder / "config.toml"
    config.write_text('default_permissions = ":workspace"\n')
    env = _codex_env(tmp_path)
    assert _install_codex(folder, env).returncode == 0
    config.write_text('model = "o3"\n' + config.read_text())  # a top-level key of the user's
    assert _uninstall_codex(folder, env).returncode == 0
    assert tomllib.loads(config.read_text()) == {"default_permissions": ":workspace", "model": "o3"}


def test_codex_unset_or_sandbox_mode_writes_no_profile_and_says_so(tmp_path):
    env = _codex_env(tmp_path)
    cases = {
        "unset": ('model = "o3"\n', "default_permissions is unset"),
        "mode": (
            'default_permissions = ":workspace"\nsandbox_mode = "workspace-write"\n',
            "Codex ignores permission profiles",
        ),
        "legacy": (
            'default_permissions = ":workspace"\n[sandbox_workspace_write]\nnetwork_access = false\n',
            "Codex ignores permission profiles",
        ),
        "profile": (
            'default_permissions = ":workspace"\n[profiles.fast]\nsandbox_mode = "read-only"\n',
            "Codex ignores permission profiles",
        ),
        "full": ('default_permissions = ":danger-full-access"\n', "no sandbox"),
    }
    for name, (text, said) in cases.items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.toml").write_text(text)
        done = _install_codex(folder, env)
        assert done.returncode == 0 and said in done.stdout, (name, done.stdout)
        assert (folder / "config.toml").read_text() == text, name
        assert not (folder / "ccsup-hook.json").exists(), name
        assert (folder / "rules" / "ccsup.rules").exists(), name
        assert _uninstall_codex(folder, env).returncode == 0
        assert (folder / "config.toml").read_text() == text, name
        assert not (folder / "rules" / "ccsup.rules").exists(), name


def test_codex_config_that_is_not_toml_is_refused_and_nothing_is_written(tmp_path):
    folder = tmp_path / "codex"
    folder.mkdir()
    config = folder / "config.toml"
    config.write_bytes(b"default_permissions = [oops\n")
    env = _codex_env(tmp_path)
    done = _install_codex(folder, env)
    assert done.returncode == 2 and str(config) in done.stderr and "not TOML" in done.stderr
    assert config.read_bytes() == b"default_permissions = [oops\n"
    assert sorted(p.name for p in folder.iterdir()) == ["config.toml"]


def test_codex_keeps_the_mcp_install_block_whatever_the_order(tmp_path):
    """`ccsup mcp install codex` finds its table by two marker comments: a rewrite of config.toml
    by `hook install` carries that block over as it is, both ways round."""
    import tomllib

    env = _codex_env(tmp_path)
    folder = tmp_path / "codex"
    folder.mkdir()
    config = folder / "config.toml"
    original = 'default_permissions = ":workspace"\n'
    config.write_text(original)

    def run_mcp(*args):
        done = ccsup("mcp", *args, "--settings", str(config), env=env)
        assert done.returncode == 0, done.stderr
        return done

    assert _install_codex(folder, env).returncode == 0  # hook, then mcp, then hook out first
    run_mcp("install", "codex")
    assert _uninstall_codex(folder, env).returncode == 0
    data = tomllib.loads(config.read_text())
    assert data["default_permissions"] == ":workspace" and "permissions" not in data
    assert "removed" in run_mcp("uninstall", "codex").stdout
    assert tomllib.loads(config.read_text()) == {"default_permissions": ":workspace"}

    config.write_text(original)  # mcp, then hook, then mcp out first
    run_mcp("install", "codex")
    with_mcp = config.read_text()
    assert _install_codex(folder, env).returncode == 0
    assert "removed" in run_mcp("uninstall", "codex").stdout
    assert "mcp_servers" not in tomllib.loads(config.read_text())
    assert tomllib.loads(config.read_text())["default_permissions"] == "ccsup"
    assert _uninstall_codex(folder, env).returncode == 0
    assert tomllib.loads(config.read_text()) == {"default_permissions": ":workspace"}
    assert "mcp_servers" in tomllib.loads(with_mcp)
