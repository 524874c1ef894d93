"""Which shell commands the hook sends through ccsup: rules (Python regular expressions searched in
the command line), the defaults, and the `[hooks]` table read fast.

The defaults name heavy work at the start of a command word (after `;`, `&`, `|`, `(`, `&&`,
`env VAR=...` or the line's start): test runners, builds, package installs, docker and podman.
A rule from `--match` or `[hooks] rules` is added to them; `[hooks] defaults = false` drops them.
A command that already runs through ccsup (`ccsup ...`, `python -m supervisor ...`) never matches,
so nothing is wrapped twice, and neither does `ccsup wait`. A command holding `ccsup-canary`\nalways matches: it is the doctor's.

Pure but for `read_hooks_table`, which reads the config file with tomllib alone: this module is
on the hook's path for every shell command, so it imports only the standard library (the full
check of `[hooks]`, with keys and lines, is supervisor.config.hooks, run by `ccsup config check`).
State: none.
"""

from __future__ import annotations

import os
import re

TYPE_CHECKING = False  # typing itself costs the hook a few ms on every shell command
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

# A command word starts the line or follows a separator, `sudo`, `time`, `env` or an assignment.
_START = r"(?:^|[;&|(`]|\$\(|\bsudo\s+|\btime\s+|\benv\s+|\b[A-Za-z_][A-Za-z0-9_]*=\S*\s+)\s*"
DEFAULT_RULES: tuple[str, ...] = tuple(
    _START + body
    for body in (
        r"(?:python3?\s+-m\s+)?(?:pytest|tox|nox|unittest)\b",
        r"(?:npm|pnpm|yarn|bun)\s+(?:test|run\s+(?:test|build|e2e|lint)|install|ci|add|build)\b",
        r"(?:npx\s+)?(?:jest|vitest|mocha|playwright\s+test)\b",
        r"(?:go|cargo)\s+(?:test|build|check|install|bench|clippy)\b",
        r"(?:make|ninja|bazel|bazelisk|meson\s+compile|cmake\s+--build|mvn|gradle|\./gradlew|sbt)\b",
        r"(?:pip3?|uv\s+pip|python3?\s+-m\s+pip)\s+install\b",
        r"(?:uv\s+sync|poetry\s+install|apt-get\s+install|apt\s+install|dnf\s+install)\b",
        r"(?:docker|podman|docker-compose)\b",
    )
)
# The doctor's canary matches whatever the rules say (supervisor.agents.doctor).
CANARY = "ccsup-canary"
_CANARY_RULE = re.compile(re.escape(CANARY))
_ALREADY = re.compile(r"^\s*(?:\S*/)?(?:ccsup|ccsup-hook)\b|-m\s+supervisor\b")
WHEN_DOWN = ("pass", "refuse")


class RuleError(ValueError):
    """A rule that is not a regular expression."""


def compile_rules(extra: Iterable[str], *, defaults: bool = True) -> list[re.Pattern[str]]:
    patterns = []
    for text in [*(DEFAULT_RULES if defaults else ()), *extra]:
        try:
            patterns.append(re.compile(text))
        except re.error as e:
            raise RuleError(f"rule {text[:80]!r} is not a regular expression: {e}") from None
    return patterns


# `ccsup wait <id>` as the hook's refusal told the model to run it (either form of ccsup).
_WAIT = re.compile(
    r"^\s*(?:\S*/)?(?:ccsup|python3?(?:\.\d+)?\s+-m\s+supervisor)\s+wait\s+[A-Za-z0-9_-]{1,128}\s*$"
)


def is_wait(command: str) -> bool:
    """A bare `ccsup wait <id>`: the hook lets it run without asking (it only waits)."""
    return _WAIT.match(command) is not None


def matching(command: str, rules: Iterable[re.Pattern[str]]) -> re.Pattern[str] | None:
    """The first rule that finds heavy work in `command`; None for one that runs through ccsup."""
    if _ALREADY.search(command):
        return None
    if CANARY in command:
        return _CANARY_RULE
    for rule in rules:
        if rule.search(command):
            return rule
    return None


def config_path(env: Mapping[str, str]) -> str | None:
    """The config file as supervisor.config.files finds it (without --config, which a hook never
    has): $CCSUP_CONFIG, else $XDG_CONFIG_HOME/ccsup/ccsup.toml if it exists."""
    if env.get("CCSUP_CONFIG"):
        return os.path.expanduser(env["CCSUP_CONFIG"])
    base = env.get("XDG_CONFIG_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(env.get("HOME") or os.path.expanduser("~"), ".config")
    path = os.path.join(base, "ccsup", "ccsup.toml")
    return path if os.path.exists(path) else None


def read_hooks_table(env: Mapping[str, str]) -> tuple[dict[str, Any], str | None]:
    """The config file's `[hooks]` table ({} without one), and a problem to log if it could not
    be read (then {}: a broken config never stops an agent's command)."""
    path = config_path(env)
    if path is None:
        return {}, None
    import tomllib

    try:
        with open(path, "rb") as f:
            table = tomllib.load(f).get("hooks", {})
    except (OSError, tomllib.TOMLDecodeError) as e:
        return {}, f"unable to read [hooks] of {path}: {e}"
    if not isinstance(table, dict):
        return {}, f"{path}: hooks is not a table"
    return table, None
