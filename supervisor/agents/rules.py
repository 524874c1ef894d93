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

TYPE_CHECKING = False  # typing itself costs the hook a few ms on every shell command
if TYPE_CHECKING:
    import re
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
# A word every default rule needs: a command with none of them is passed without compiling a rule
# (compiling the defaults costs more than the rest of the hook's own work).
DEFAULT_WORDS = frozenset(
    "pytest tox nox unittest npm pnpm yarn bun jest vitest mocha playwright go cargo make ninja "
    "bazel bazelisk meson cmake mvn gradle gradlew ./gradlew sbt pip pip3 uv poetry apt-get apt "
    "dnf docker podman docker-compose".split()
)
# Substrings of the raw hook JSON one of which any default rule's word holds: a payload with none
# of them passes before any JSON is parsed (importing json costs more than the rest of the hook).
# JSON encoders never escape ASCII letters, digits or '-', so a word in the command is in the
# payload as it is.
PAYLOAD_HINTS = tuple(
    w.encode()
    for w in "pytest tox nox unittest npm yarn bun jest mocha playwright go cargo make ninja bazel "
    "meson mvn gradle sbt pip uv poetry apt dnf docker podman wait".split()
)
_SEPARATORS = str.maketrans({c: " " for c in ";&|()`$<>\"'\t\n\r{}"})
# The doctor's canary matches whatever the rules say (supervisor.agents.doctor).
CANARY = "ccsup-canary"
_ALREADY = r"^\s*(?:\S*/)?(?:ccsup|ccsup-hook)\b|-m\s+supervisor\b"
WHEN_DOWN = ("pass", "refuse")


class RuleError(ValueError):
    """A rule that is not a regular expression."""


def compile_rules(extra: Iterable[str], *, defaults: bool = True) -> list[re.Pattern[str]]:
    import re

    patterns = []
    for text in [*(DEFAULT_RULES if defaults else ()), *extra]:
        try:
            patterns.append(re.compile(text))
        except re.error as e:
            raise RuleError(f"rule {text[:80]!r} is not a regular expression: {e}") from None
    return patterns


def surely_unmatched(raw: bytes) -> bool:
    """True when a payload is a JSON object with a string command that cannot be one the default
    rules (or the canary, or `ccsup wait`) would take: then nothing needs parsing. Only for the
    defaults alone (no extra rules). Anything else (not an object, no string command) is parsed,
    so that a bad payload is logged."""
    body = raw.strip()
    if not (body.startswith(b"{") and body.endswith(b"}")):
        return False
    at = body.find(b'"command"')
    if at < 0 or not body[at + 9 :].lstrip(b" \t\r\n:").startswith(b'"'):
        return False
    return CANARY.encode() not in raw and not any(hint in raw for hint in PAYLOAD_HINTS)


def has_hooks_table(env: Mapping[str, str]) -> bool:
    """Whether the config file may hold a `[hooks]` table (read as bytes: no TOML parsed)."""
    path = config_path(env)
    if path is None:
        return False
    try:
        with open(path, "rb") as f:
            return b"hooks" in f.read()
    except OSError:
        return True  # unreadable: the full path says why in the log


def words(command: str) -> set[str]:
    """The command's words, split at blanks and shell punctuation, paths also as their names."""
    found = set(command.translate(_SEPARATORS).split())
    return found | {w.rsplit("/", 1)[-1] for w in found if "/" in w}


def rule_for(command: str, extra: list[str], *, defaults: bool = True) -> str | None:
    """The rule (its pattern) that sends `command` through ccsup, or None. RuleError for an extra
    rule that is not a regular expression. Compiles nothing for a command that holds no default
    rule's word when there are no extra rules: the common case, before every shell command."""
    if CANARY in command:
        return CANARY
    mine = words(command)
    if "ccsup" in mine or "supervisor" in mine:
        import re

        if re.search(_ALREADY, command):
            return None
    if not extra and not (defaults and mine & DEFAULT_WORDS):
        return None
    rule = matching(command, compile_rules(extra, defaults=defaults))
    return rule.pattern if rule is not None else None


# `ccsup wait <id>` as the hook's refusal told the model to run it (either form of ccsup).
_WAIT = (
    r"^\s*(?:\S*/)?(?:ccsup|python3?(?:\.\d+)?\s+-m\s+supervisor)\s+wait\s+[A-Za-z0-9_-]{1,128}\s*$"
)


def is_wait(command: str) -> bool:
    """A bare `ccsup wait <id>`: the hook lets it run without asking (it only waits)."""
    if " wait " not in command:
        return False
    import re

    return re.match(_WAIT, command) is not None


def matching(command: str, rules: Iterable[re.Pattern[str]]) -> re.Pattern[str] | None:
    """The first rule that finds heavy work in `command`; None for one that runs through ccsup."""
    import re

    if re.search(_ALREADY, command):
        return None
    if CANARY in command:
        return re.compile(re.escape(CANARY))
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
