"""`[harness.<name>]`: per harness (the part of a key before ':'), defaults a request may rely on.

The pattern for a table of named tables (`[limits.<key>]`, `[pause_on.<key>]` follow it): the
section's path ends in `*`, each entry is checked against that schema with `c.table(..., schema=)`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..caps import key_problem
from .schema import Checker, Key, Section, Table, kind
from .values import cap

SECTION = Section(
    ("harness", "*"),
    "Per harness (the part of a key before ':'): defaults a request may rely on.",
    (
        Key(
            "command",
            ["codex", "app-server"],
            "The command a sidecar runs for this harness.",
            example=True,
        ),
        Key(
            "default_cap",
            2,
            "The cap of this harness's keys that `caps` does not name.",
            example=True,
        ),
    ),
    example=True,
    example_name="codex",
)


@dataclass(frozen=True)
class Harness:
    """`[harness.<name>]`: defaults a request may rely on."""

    name: str
    command: list[str] | None = None
    default_cap: int | None = None


def parse_harness(c: Checker, top: Table) -> dict[str, Harness]:
    table = top.get("harness", {})
    if not isinstance(table, dict):
        c.add(("harness",), f"must be a table of [harness.<name>] tables, not {kind(table)}")
        return {}
    harness = {}
    for name in table:
        path = ("harness", name)
        problem = key_problem(name)
        if problem or ":" in name:
            c.add(path, f"bad harness name: {problem or 'a harness name has no :variant part'}")
            continue
        entry = c.table(table, path, schema=SECTION.path)
        command = None
        if "command" in entry:
            value = entry["command"]
            if (
                not isinstance(value, list)
                or not value
                or not all(isinstance(arg, str) for arg in value)
                or not value[0]
            ):
                c.add(
                    path + ("command",), "must be a non-empty array of strings, the program first"
                )
            else:
                command = list(value)
        default_cap = (
            c.run(path + ("default_cap",), cap, entry["default_cap"])
            if "default_cap" in entry
            else None
        )
        harness[name] = Harness(name, command, default_cap)
    return harness
