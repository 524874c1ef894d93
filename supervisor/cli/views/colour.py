"""Colour for people at a terminal: state words and failures, never in pipes or files.

On when the stream is a terminal, `NO_COLOR` is unset or empty (no-color.org) and TERM is not
`dumb`. `paint_column` colours one column of a table already cut to fit (so widths and cuts are
the plain text's): each cell whose word is in the palette, from the header line down to the
table's end (a blank line). Knows click.style and nothing of what the tables mean.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TextIO

import click

# Words of ps, history and the error line, and their colour.
STATES = {
    "held": "green",
    "reserved": "cyan",
    "free": "bright_black",
    "orphaned": "red",
    "unreadable": "red",
    "key_full": "yellow",
    "machine_full": "yellow",
    "paused": "yellow",
    "rate": "yellow",
    "low_memory": "red",
}


def enabled(stream: TextIO | None = None) -> bool:
    stream = stream or sys.stdout
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def state_colour(cell: str) -> str | None:
    """The colour of a state or why cell (`held`, `paused until ...`), by its first word."""
    return STATES.get(cell.split(" ", 1)[0])


def paint_column(
    lines: list[str], column: str, colour_of: Callable[[str], str | None]
) -> list[str]:
    out: list[str] = []
    start: int | None = None
    end: int | None = None
    for line in lines:
        if start is None:
            at = line.find(column)
            if at >= 0 and (at == 0 or line[at - 1] == " "):
                start = at
                rest = line[at + len(column) :]
                gap = len(rest) - len(rest.lstrip(" "))
                end = at + len(column) + gap if rest.strip() else None
            out.append(line)
            continue
        if not line.strip():
            start = end = None
            out.append(line)
            continue
        cell = line[start:end].rstrip()
        colour = colour_of(cell) if cell else None
        if colour:
            line = line[:start] + click.style(cell, fg=colour) + line[start + len(cell) :]
        out.append(line)
    return out


def outcome_colour(outcome: str) -> str | None:
    """An outcome of history: ok green, a failure red, a cancel yellow."""
    if outcome in ("ok", "exit 0"):
        return "green"
    if outcome.startswith(("exit", "signal", "guard_lost", "rejected", "timeout", "oom", "error")):
        return "red"
    if outcome.startswith("cancel"):
        return "yellow"
    return None
