"""The cells and tables every command prints with: ages, groups, commands, the terminal's width,
aligned tables. Pure; imports no other module of supervisor.cli."""

from __future__ import annotations


def format_age(seconds: float | None) -> str:
    """3s, 2m05s, 1h02m, 2d03h; '-' when unknown."""
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def age(since, now: float) -> str:
    return format_age(now - since) if isinstance(since, (int, float)) else "-"


def format_groups(groups) -> str:
    """How many process groups the slot's work was recorded in (a big turn has hundreds: the
    list is in `ps --json`)."""
    return str(len(groups)) if groups else "-"


def format_command(argv, cwd=None) -> str:
    """A turn's command as a shell would read it back, on one line (a newline or other control
    character inside an argument shown escaped, `\\n`, as bash's `$'...'` would); '-' when
    unknown."""
    import shlex

    if not isinstance(argv, list) or not argv:
        return "-"
    return shlex.join(argv).translate(_ONE_LINE)


# Control characters a table row must not contain (a newline broke a row in two).
_ONE_LINE = {c: f"\\x{c:02x}" for c in range(32)} | {10: "\\n", 13: "\\r", 9: "\\t"}


def terminal_width() -> int | None:
    """The width to cut table lines to: the terminal's when stdout is one, else None (whole)."""
    import shutil
    import sys

    if not sys.stdout.isatty():
        return None
    return shutil.get_terminal_size().columns  # $COLUMNS first, then the terminal's own


def fit(lines: list[str], width: int | None) -> list[str]:
    """Lines cut to `width` characters (the last column, COMMAND, loses its end), '…' marking
    the cut; unchanged when width is None."""
    if width is None:
        return lines
    return [line if len(line) <= width else line[: max(1, width - 1)] + "…" for line in lines]


def format_size(n: float | None) -> str:
    """Bytes as ps and status show them: 512MiB, 1.20GiB; "-" for none."""
    if not isinstance(n, int | float):
        return "-"
    if n >= 1 << 30:
        return f"{n / (1 << 30):.2f}GiB"
    if n >= 1 << 20:
        return f"{n / (1 << 20):.0f}MiB"
    return f"{n / 1024:.0f}KiB"


def mem_now(slot: dict) -> int | None:
    used = slot.get("usage")
    mem = used.get("mem") if isinstance(used, dict) else None
    return mem if isinstance(mem, int) else None


def format_table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(str(cell).ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]
