"""`[hooks]`: which shell commands `ccsup hook` sends through ccsup, under which key, and what
happens when no supervisor runs.

The hook itself reads this table with tomllib alone (supervisor.agents.rules: it runs before
every shell command and must not pay for this package); this module is the full check, with keys
and lines, that `ccsup config check` and every `load` run. A rule is a Python regular expression
searched in the command line; `defaults = false` drops the built-in rules (test runners, builds,
package installs, docker) and keeps only `rules`.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from ..caps import check_key
from ..errors import ConfigError, UsageError
from .schema import Checker, Key, Section, Table

WHEN_DOWN = ("pass", "refuse")

SECTION = Section(
    ("hooks",),
    "Agent hooks (`ccsup hook install claude|codex|opencode`): which shell commands run as turns.",
    (
        Key(
            "rules",
            ["^\\./run-tests\\b"],
            "Python regular expressions searched in a shell command line; a command any of them\n"
            "finds (or a built-in rule, unless `defaults = false`) runs as a ccsup turn.",
            example=True,
        ),
        Key(
            "defaults",
            True,
            "Keep the built-in rules: test runners, builds, package installs, docker, podman.",
        ),
        Key(
            "key",
            "default",
            "The cap key of the rewritten commands (a hook's --key wins; default: $CCSUP_KEY,\n"
            "else `default`).",
            example=True,
        ),
        Key(
            "when_down",
            "pass",
            'With no supervisor running: "pass" runs the command as it would have run without\n'
            'ccsup (said once per session in the hook log), "refuse" tells the agent to start one.',
        ),
    ),
)


class HookSettings(NamedTuple):
    rules: tuple[str, ...] = ()
    defaults: bool = True
    key: str | None = None
    when_down: str = "pass"


def _rules(value: object, *, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(r, str) for r in value):
        raise ConfigError(f"{where}: write a list of regular expressions (strings)")
    for text in value:
        try:
            re.compile(text)
        except re.error as e:
            raise ConfigError(f"{where}: {text!r} is not a regular expression: {e}") from None
    return tuple(value)


def _flag(value: object, *, where: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: write true or false")
    return value


def _when_down(value: object, *, where: str) -> str:
    if value not in WHEN_DOWN:
        raise ConfigError(f'{where}: {value!r} is not one of "pass", "refuse"')
    return str(value)


def _key(value: object, *, where: str) -> str:
    try:
        return check_key(value)
    except UsageError as e:
        raise ConfigError(f"{where}: {e.message}") from None


def parse_hooks(c: Checker, top: Table) -> HookSettings:
    table = c.table(top, ("hooks",))
    rules = c.run(("hooks", "rules"), _rules, table.get("rules", []))
    defaults = c.run(("hooks", "defaults"), _flag, table.get("defaults", True))
    key = c.run(("hooks", "key"), _key, table["key"]) if "key" in table else None
    when_down = c.run(("hooks", "when_down"), _when_down, table.get("when_down", "pass"))
    return HookSettings(
        rules=rules or (),
        defaults=True if defaults is None else defaults,
        key=key,
        when_down=when_down or "pass",
    )
