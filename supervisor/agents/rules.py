"""Which shell commands the hook sends through ccsup, and whether the hook may approve the line:
rules (Python regular expressions), the defaults with their names, and the `[hooks]` table read
fast.

Each rule is searched in every simple command of the line (supervisor.agents.shell_line: the
line read as a shell reads it, the wrappers agents type taken off); the first one found is the
`Match`, `plain` when the whole line is exactly that one plain simple command (the only line the
hook approves without the harness asking). A simple command whose first word is ccsup (or a
Python with `-m supervisor`) is already through ccsup and never matches. A command holding
`ccsup-canary` always matches: it is the doctor's. `is_wait` knows exactly the `wait` line the
hook's refusal prints, and nothing else.

Pure but for `read_hooks_table`, which reads the config file with tomllib alone: this module is
on the hook's path for every shell command, so it imports only the standard library, and the line
is parsed only once a default rule's word (or an extra rule) makes a match possible (the full
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

# A command word starts the text or follows `env VAR=...` or an assignment. Each rule is searched
# in every simple command of a line (supervisor.agents.shell_line: wrappers taken off), and in the
# whole line only when the line cannot be parsed.
_START = r"(?:^|\benv\s+|\b[A-Za-z_][A-Za-z0-9_]*=\S*\s+)\s*"
_DEFAULTS: tuple[tuple[str, str], ...] = (
    ("python tests", r"(?:python3?\s+-m\s+)?(?:pytest|tox|nox|unittest)\b"),
    (
        "node packages and scripts",
        r"(?:npm|pnpm|yarn|bun)\s+(?:test|run\s+(?:test|build|e2e|lint)|install|ci|add|build)\b",
    ),
    ("node tests", r"(?:npx\s+)?(?:jest|vitest|mocha|playwright\s+test)\b"),
    ("go and cargo", r"(?:go|cargo)\s+(?:test|build|check|install|bench|clippy)\b"),
    (
        "builds",
        r"(?:make|ninja|bazel|bazelisk|meson\s+compile|cmake\s+--build|mvn|gradle|\./gradlew|sbt)\b",
    ),
    ("pip installs", r"(?:pip3?|uv\s+pip|python3?\s+-m\s+pip)\s+install\b"),
    (
        "package installs",
        r"(?:uv\s+sync|poetry\s+install|apt-get\s+install|apt\s+install|dnf\s+install)\b",
    ),
    ("containers", r"(?:docker|podman|docker-compose)\b"),
)
DEFAULT_RULES: tuple[str, ...] = tuple(_START + body for _, body in _DEFAULTS)
_BODIES = {_START + body: body for _, body in _DEFAULTS}
# Where a command word may start in a line that could not be read (one regex pass per rule).
_START_ANYWHERE = (
    r"(?:^|[;&|()`{\n]|\$\(|\bsudo\s+|\btime\s+|\benv\s+|\b[A-Za-z_][A-Za-z0-9_]*=\S*\s+|"
    r"\b(?:then|do|else|timeout\s+\S+|nice|exec|command|npx|run)\s+)\s*"
)
RULE_NAMES: dict[str, str] = {_START + body: name for name, body in _DEFAULTS}
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


class Match:
    """What sends a line through ccsup: the rule (its pattern) and its name, the simple command it
    found (`heavy`, as words), and `plain`: the whole line is exactly that one plain simple
    command (supervisor.agents.shell_line), the only kind the hook may approve itself."""

    __slots__ = ("heavy", "name", "plain", "rule")

    def __init__(self, rule: str, name: str, heavy: list[str] | None, plain: bool):
        self.rule = rule
        self.name = name
        self.heavy = heavy
        self.plain = plain


def rule_name(pattern: str) -> str:
    """A default rule's name; a rule of the user's is named by its pattern."""
    if pattern in (CANARY, "ccsup\\-canary"):
        return "the doctor's canary"
    return RULE_NAMES.get(pattern) or f"/{pattern}/"


def through_ccsup(argv: list[str], executable: str | None = None) -> bool:
    """A simple command that already runs through ccsup: its first word is ccsup, or a Python
    interpreter (ours, or any python) with `-m supervisor`."""
    if not argv:
        return False
    head = argv[0].rsplit("/", 1)[-1]
    if head in ("ccsup", "ccsup-hook"):
        return True
    python = argv[0] == executable or head.startswith("python")
    return python and argv[1:3] == ["-m", "supervisor"]


def runs_ccsup_run(command: str) -> bool:
    """Whether a line runs `ccsup run` itself, as a model may type it: a simple command through
    ccsup (through_ccsup) whose words hold `run`, wherever it stands (after `;`, in `bash -c`,
    behind a wrapper). In Codex, `hook install` lets such lines run outside the sandbox without
    asking (supervisor.agents.codex_sandbox), so the hook refuses them there: only its own
    rewrites are run so. A line the shell reader does not understand counts when its words hold
    `run` and `ccsup` or `supervisor`."""
    mine = words(command)
    if "run" not in mine or not ({"ccsup", "supervisor"} & mine):
        return False
    from supervisor.agents import shell_line

    try:
        line = shell_line.parse(command)
    except shell_line.Unparsed:
        return True
    return any(through_ccsup(simple.argv) and "run" in simple.argv for simple in line.commands)


def judge(command: str, extra: list[str], *, defaults: bool = True) -> Match | None:
    """The rule that sends `command` through ccsup (None: none does), and whether the line is one
    plain simple command. RuleError for an extra rule that is not a regular expression. Compiles
    nothing for a command that holds no default rule's word when there are no extra rules: the
    common case, before every shell command."""
    mine = words(command)
    canary = CANARY in command
    if not canary and not extra and not (defaults and mine & DEFAULT_WORDS):
        return None
    patterns = compile_rules(extra, defaults=defaults)
    if canary:
        import re

        patterns.insert(0, re.compile(re.escape(CANARY)))
    from supervisor.agents import shell_line

    try:
        line = shell_line.parse(command)
    except shell_line.Unparsed:  # not understood: searched in the whole line, never plain
        import re

        for rule in patterns:
            body = _BODIES.get(rule.pattern)
            wide = re.compile(_START_ANYWHERE + body) if body is not None else rule
            if wide.search(command):
                return Match(rule.pattern, rule_name(rule.pattern), None, False)
        return None
    if line.plain is not None:
        found = _first(line.plain.argv, patterns)
        if found is not None:
            return Match(found.pattern, rule_name(found.pattern), line.plain.argv, True)
    for simple in line.commands:
        found = _first(simple.argv, patterns)
        if found is not None:
            return Match(found.pattern, rule_name(found.pattern), simple.argv, False)
    return None


def _first(argv: list[str], patterns: list[re.Pattern[str]]) -> re.Pattern[str] | None:
    if not argv or through_ccsup(argv):
        return None
    texts = [" ".join(argv)]
    if "/" in argv[0]:  # a tool named by path: also as its name
        texts.append(" ".join([argv[0].rsplit("/", 1)[-1], *argv[1:]]))
    for rule in patterns:
        if any(rule.search(text) for text in texts):
            return rule
    return None


def rule_for(command: str, extra: list[str], *, defaults: bool = True) -> str | None:
    """The rule (its pattern) that sends `command` through ccsup, or None."""
    found = judge(command, extra, defaults=defaults)
    return found.rule if found is not None else None


_WAIT_ID = "0123456789abcdef"


def is_wait(command: str, ccsup: list[str]) -> bool:
    """Exactly the `wait` line the hook's refusal printed (supervisor.agents.route.wait_hint):
    `ccsup` (our interpreter by its absolute path, `-m supervisor` and the state directory and
    config), `wait`, and a turn id of 32 hex digits. Nothing else, not even the same words quoted
    another way."""
    if " wait " not in command:
        return False
    import shlex

    turn_id = command.strip().rpartition(" ")[2]
    if len(turn_id) != 32 or turn_id.strip(_WAIT_ID):
        return False
    return command.strip() == shlex.join([*ccsup, "wait", turn_id])


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
