"""What Codex's sandbox needs for a hooked command's `ccsup run` client to reach the supervisor,
written by `ccsup hook install codex` beside hooks.json (its folder: $CODEX_HOME, else ~/.codex)
and removed by `uninstall`.

- `rules/ccsup.rules`: one execpolicy rule, `prefix_rule(pattern=[<our rewrite's start>, "run"],
  decision="allow")`. Codex runs a command every segment of which such a rule allows without its
  sandbox (the Codex counterpart of Claude Code's `excludedCommands`): on Linux this is what lets
  the client connect, since Codex's seccomp filter refuses every connect(2) when the profile's
  network is off, listed unix sockets or not.
- config.toml, the sockets (control, bus-in, bus-out) as `"<path>" = "allow"` under
  `[permissions.<profile>.network.unix_sockets]` of the profile `default_permissions` names:
  a profile of the user's own gets them added; a built-in (`:workspace`, `:read-only`) gets a
  profile `ccsup` that `extends` it with only those sockets, and `default_permissions` points at
  it. Nothing is written when default_permissions is unset (choosing the user's profile is not
  ours to do), names `:danger-full-access` (no sandbox) or a profile that does not exist, or when
  the older `sandbox_mode`/`[sandbox_workspace_write]` settings are there (Codex then ignores
  permission profiles). `verdict` says which applies.

State: `ccsup-hook.json` beside config.toml records what install changed (the file's bytes before
and after, the profile, the sockets added, default_permissions before). Run again: the old change
is undone first, then made anew. Uninstall: the file as it was, byte for byte, when it is still
exactly what install wrote; else only our entries are taken out (the user's other keys kept; TOML
comments and layout are then not kept). A config.toml that is not TOML: refused, naming it,
nothing written. Stopped half-way: each file is replaced atomically; the record is written
before config.toml and removed after it is restored, so a run again finds what to undo (a record
whose change never reached the file undoes nothing: it names only what install added).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tomllib
from pathlib import Path

import tomli_w

from ..errors import CcsupError, UsageError
from . import mcp_install
from .install import MARK, write_atomic

PROFILE = "ccsup"
BUILT_INS = (":workspace", ":read-only")
RECORD = "ccsup-hook.json"
RULES = Path("rules") / "ccsup.rules"


def _read(path: Path) -> tuple[bytes | None, dict]:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None, {}
    except OSError as e:
        raise CcsupError(f"unable to read {path}: {e.strerror}") from None
    try:
        return raw, tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise UsageError(f"{path} is not TOML ({e}); nothing was written") from None


def _mcp_block(raw: bytes | None) -> tuple[dict, str]:
    """The file's keys without `ccsup mcp install`'s marked block, and that block's text: the
    block is kept as it is (its markers are how `mcp uninstall` finds it) after our rewrite."""
    text = raw.decode("utf-8") if raw is not None else ""
    rest, found = mcp_install._without_block(text)
    if not found:
        return tomllib.loads(text), ""
    lines = text.splitlines(keepends=True)
    begin = next(i for i, line in enumerate(lines) if line.rstrip("\n") == mcp_install.BEGIN)
    end = next(i for i in range(begin, len(lines)) if lines[i].rstrip("\n") == mcp_install.END)
    return tomllib.loads(rest), "".join(lines[begin : end + 1])


def _render(data: dict, block: str) -> bytes:
    out = tomli_w.dumps(data)
    if block:
        out += ("\n" if out else "") + block
    tomllib.loads(out)  # what we write is TOML, or nothing is written
    return out.encode("utf-8")


def _legacy(data: dict) -> bool:
    profiles = data.get("profiles")
    return (
        "sandbox_mode" in data
        or "sandbox_workspace_write" in data
        or (
            isinstance(profiles, dict)
            and any(isinstance(p, dict) and "sandbox_mode" in p for p in profiles.values())
        )
    )


def verdict(data: dict) -> tuple[str | None, str]:
    """(the profile to hold our sockets, or None; what applies, in words)."""
    if _legacy(data):
        return None, (
            "config.toml uses sandbox_mode/[sandbox_workspace_write]: Codex ignores permission "
            "profiles, so none was written"
        )
    name = data.get("default_permissions")
    if name is None:
        return None, "default_permissions is unset: no permission profile was written"
    if name == ":danger-full-access":
        return None, "default_permissions is :danger-full-access (no sandbox): nothing to add"
    if name in BUILT_INS:
        return PROFILE, f"profile {PROFILE!r} extends {name} with only our sockets"
    permissions = data.get("permissions")
    if isinstance(name, str) and isinstance(permissions, dict) and name in permissions:
        return name, f"our sockets are added to your profile {name!r}"
    return None, f"default_permissions names {name!r}, which is not defined: nothing was written"


def _sockets_table(profile: dict) -> dict:
    network = profile.setdefault("network", {})
    if not isinstance(network, dict):
        raise UsageError("the profile's 'network' is not a table; nothing was written")
    sockets = network.setdefault("unix_sockets", {})
    if not isinstance(sockets, dict):
        raise UsageError("the profile's network.unix_sockets is not a table; nothing was written")
    return sockets


def _remove_entries(data: dict, record: dict) -> dict:
    """`data` without what `record` says install added (the user's other keys kept)."""
    permissions = data.get("permissions")
    name = record["profile"]
    if record.get("created"):
        if isinstance(permissions, dict):
            permissions.pop(name, None)
            if not permissions:
                data.pop("permissions")
        if data.get("default_permissions") == name:
            if record.get("default_before") is None:
                data.pop("default_permissions")
            else:
                data["default_permissions"] = record["default_before"]
        return data
    profile = permissions.get(name) if isinstance(permissions, dict) else None
    network = profile.get("network") if isinstance(profile, dict) else None
    sockets = network.get("unix_sockets") if isinstance(network, dict) else None
    if isinstance(profile, dict) and isinstance(network, dict) and isinstance(sockets, dict):
        for path in record["added"]:
            sockets.pop(path, None)
        if not sockets:
            network.pop("unix_sockets")
        if not network:
            profile.pop("network")
    return data


def _undo(config: Path) -> bool:
    record_path = config.with_name(RECORD)
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return False
    except ValueError as e:
        raise UsageError(f"{record_path} is not JSON ({e}); left as it is") from None
    raw, data = _read(config)
    if raw is not None and hashlib.sha256(raw).hexdigest() == record["after_sha256"]:
        before = record["before"]
        if before is None:
            config.unlink()
        else:
            write_atomic(config, before.encode("utf-8"))
    elif raw is not None:
        data, block = _mcp_block(raw)
        write_atomic(config, _render(_remove_entries(data, record), block))
    record_path.unlink()
    return True


def rules_text(words: list[str]) -> str:
    pattern = ", ".join(json.dumps(w) for w in [*words, "run"])
    return (
        f"# ccsup: a hooked command's `ccsup run` client runs outside Codex's sandbox ({MARK}).\n"
        "# Written by `ccsup hook install codex`; `ccsup hook uninstall codex` removes this file.\n"
        f'prefix_rule(pattern=[{pattern}], decision="allow")\n'
    )


def check(folder: Path) -> None:
    """Refuse (UsageError naming it) a config.toml that is not TOML, before anything is written."""
    _read(folder / "config.toml")


def install(folder: Path, words: list[str], sockets: list[str]) -> list[str]:
    """Write the rule and the sockets into Codex's folder; answers what was done, in lines."""
    config = folder / "config.toml"
    check(folder)
    _undo(config)
    raw, _ = _read(config)
    data, block = _mcp_block(raw)
    rules = folder / RULES
    rules.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(rules, rules_text(words).encode("utf-8"))
    lines = [f"Codex runs `{' '.join([*words, 'run'])} ...` outside its sandbox ({rules})"]
    name, said = verdict(data)
    lines.append(f"Codex permissions ({config}): {said}")
    if name is None:
        return lines
    record: dict = {"profile": name, "created": name == PROFILE, "added": []}
    permissions = data.setdefault("permissions", {})
    if not isinstance(permissions, dict):
        raise UsageError(f"{config}: 'permissions' is not a table; nothing was written")
    if record["created"]:
        if PROFILE in permissions:
            raise UsageError(
                f"{config}: a profile named {PROFILE!r} is there already; nothing was written"
            )
        record["default_before"] = data["default_permissions"]
        permissions[PROFILE] = {"extends": data["default_permissions"]}
        data["default_permissions"] = PROFILE
    profile = permissions[name]
    if not isinstance(profile, dict):
        raise UsageError(f"{config}: permissions.{name} is not a table; nothing was written")
    table = _sockets_table(profile)
    for path in sockets:
        if path not in table:
            table[path] = "allow"
            record["added"].append(path)
    after = _render(data, block)
    record.update(
        before=raw.decode("utf-8") if raw is not None else None,
        after_sha256=hashlib.sha256(after).hexdigest(),
    )
    write_atomic(config.with_name(RECORD), json.dumps(record, indent=2).encode("utf-8"))
    write_atomic(config, after)
    return lines


def uninstall(folder: Path) -> bool:
    """Remove the rule and what install changed in config.toml; answers whether there was any."""
    rules = folder / RULES
    removed = False
    try:
        if MARK in rules.read_text(encoding="utf-8"):
            rules.unlink()
            removed = True
    except FileNotFoundError:
        pass
    return _undo(folder / "config.toml") or removed


def status(folder: Path) -> list[str]:
    """What `hook doctor codex` says about Codex's sandbox and our entries."""
    config = folder / "config.toml"
    _raw, data = _read(config)
    rules = folder / RULES
    ours = rules.exists() and MARK in rules.read_text(encoding="utf-8")
    lines = [
        f"Codex sandbox rule: {rules}"
        if ours
        else f"Codex sandbox rule: none ({rules} missing): in Codex's sandbox the hooked command "
        "cannot reach the supervisor"
    ]
    name, said = verdict(data)
    if name == PROFILE and data.get("default_permissions") == PROFILE:
        said = f"default_permissions is our profile {PROFILE!r}"
    lines.append(f"Codex permissions ({config}): {said}")
    temp = Path(os.environ.get("TMPDIR") or "/tmp")
    if sys.platform == "linux" and folder.absolute().is_relative_to(temp):
        lines.append(
            f"warning: {folder} is under the temporary folder {temp}: Codex then makes no "
            "codex-linux-sandbox alias and its sandbox cannot start (bwrap: execvp "
            "codex-linux-sandbox); set TMPDIR to a folder that does not hold it"
        )
    return lines
