"""`[harness.<name>]`: per harness (the part of a key before ':'), defaults a request may rely on.

The pattern for a table of named tables (`[limits.<key>]`, `[pause_on.<key>]` follow it): the
section's path ends in `*`; `schema.per_key` gives each entry whose name is good, and each is
checked against that schema with `c.table(..., schema=)`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..caps import key_problem
from .schema import Checker, Key, Section, Table, per_key
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


def _name_problem(name: str) -> str | None:
    """A harness is named as a cap key is, without its :variant part."""
    return key_problem(name) or ("a harness name has no :variant part" if ":" in name else None)


def parse_harness(c: Checker, top: Table) -> dict[str, Harness]:
    harness = {}
    for name, path, _ in per_key(
        c.add,
        top,
        ("harness",),
        holds="[harness.<name>] tables",
        check_key=_name_problem,
        bad_key="bad harness name",
    ):
        entry = c.table(top["harness"], path, schema=SECTION.path)
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
