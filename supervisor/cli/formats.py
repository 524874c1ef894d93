"""How `ccsup status` and `ccsup ps` print: ages, holders, groups, aligned tables. Pure."""

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


def format_table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(str(cell).ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]


def format_ps(ps: dict, now: float) -> list[str]:
    from ..wire.requester import describe
    from .keys import format_keys, format_why

    slots = ps.get("slots", [])
    waits = ps.get("waits", [])
    lines = []
    if slots:
        rows = [
            [
                s.get("key", "?"),
                str(s.get("index", "?")),
                str(s.get("cap", "?")),
                s.get("state", "?"),
                s.get("turn") or "-",
                describe(s.get("holder"), s.get("requester")),
                str(s.get("pid") or "-"),
                format_groups(s.get("groups")),
                age(s.get("since"), now),
            ]
            for s in slots
        ]
        lines += format_table(
            ["KEY", "INDEX", "CAP", "STATE", "TURN", "HOLDER", "PID", "GROUPS", "AGE"], rows
        )
    else:
        lines.append("no slots")
    lines.append("")
    if waits:
        rows = [
            [
                str(w.get("position", "?")),
                w.get("id", "?"),
                w.get("key", "?"),
                describe(w.get("holder"), w.get("requester")),
                age(w.get("since"), now),
                format_why(w.get("why"), now),
            ]
            for w in waits
        ]
        lines += format_table(["POS", "ID", "KEY", "HOLDER", "WAITING", "WHY"], rows)
    else:
        lines.append("no one waiting")
    keys = format_keys(ps, now)  # paused keys and rate windows
    return lines + ([""] + keys if keys else [])
