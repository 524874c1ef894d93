"""`[wrap]`: the cap key of `ccsup wrap` (whole interactive harness sessions as `-t` turns) and its
cap when nothing else names one.

A wrapped session is a long turn that mostly waits for a person, so the key's cap is not the
machine's protection (the session's own heavy commands are turns of their own keys, through the
hook and MCP): `cap` only keeps an accident (a loop that starts sessions) in bounds. It is the
key's cap unless `[slots] caps` names the key (or its harness part) or `[harness.<h>] default_cap`
gives one: it acts as `[harness.<key's harness>] default_cap`.
"""

from __future__ import annotations

from typing import NamedTuple

from ..caps import check_key
from ..errors import ConfigError, UsageError
from . import values
from .schema import Checker, Key, Section, Table

DEFAULT_KEY = "session"
DEFAULT_CAP = 32

SECTION = Section(
    ("wrap",),
    "`ccsup wrap <harness>`: interactive harness sessions as contained terminal turns.",
    (
        Key("key", DEFAULT_KEY, "The cap key of wrapped sessions (`ccsup wrap --key` wins)."),
        Key(
            "cap",
            DEFAULT_CAP,
            "Wrapped sessions at once, unless [slots] caps or [harness.<h>] default_cap names\n"
            "the key: a session mostly waits for its person, so this is high.",
        ),
    ),
)


class WrapSettings(NamedTuple):
    key: str = DEFAULT_KEY
    cap: int = DEFAULT_CAP


def _key(value: object, *, where: str) -> str:
    try:
        return check_key(value)
    except UsageError as e:
        raise ConfigError(f"{where}: {e.message}") from None


def parse_wrap(c: Checker, top: Table) -> WrapSettings:
    table = c.table(top, ("wrap",))
    key = c.run(("wrap", "key"), _key, table.get("key", DEFAULT_KEY))
    cap = c.run(("wrap", "cap"), values.cap, table.get("cap", DEFAULT_CAP))
    return WrapSettings(key=key or DEFAULT_KEY, cap=DEFAULT_CAP if cap is None else cap)
