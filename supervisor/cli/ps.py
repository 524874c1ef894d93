"""`ccsup ps [--key K]... [--json]`: slots by key, then the waiters in order; `--key` keeps only
the keys it names or matches (a shell glob), in the table and in --json alike. The table is made
here (`format_ps`, pure), from supervisor.cli.views.formats' cells and supervisor.cli.views.keys' words."""

from __future__ import annotations

import time

import click

from .options import complete_keys, key_matches, key_patterns_option
from .where import emit_json, where


@click.command()
@click.option(
    "--key",
    "keys",
    multiple=True,
    callback=key_patterns_option,
    shell_complete=complete_keys,
    metavar="KEY",
    help="Only this cap key, or keys matching this glob ('opencode:*'); repeatable.",
)
@click.option("--json", "as_json", is_flag=True, help="Print exactly the ps result as JSON.")
@click.pass_context
def ps(ctx: click.Context, keys: list[str] | None, as_json: bool) -> None:
    """Slots by key (state, turn, holder, pid, groups, age), then the waiters in order.

    \b
    Examples:
      ccsup ps --key codex --key 'opencode:*'
      ccsup ps --json | jq '.waits[].id'"""
    with where(ctx).client() as client:
        result = client.ps()
    if keys is not None:  # the same shape, with only the keys asked for
        for part in ("slots", "slot_keys", "waits", "keys"):
            if part in result:
                result[part] = [
                    e
                    for e in result[part]  # a pool's turn: its member's slot, or its pool
                    if key_matches(e.get("key", ""), keys) or key_matches(e.get("pool") or "", keys)
                ]
    if as_json:
        emit_json(result)
        return
    from .views.formats import terminal_width  # not for --json

    lines = format_ps(result, time.time(), terminal_width())
    if "cluster" in result:  # [cluster]: the cluster keys on every machine
        from .views.cluster import format_cluster_ps

        lines += format_cluster_ps(result["cluster"], time.time())
    from .views import colour

    if colour.enabled():  # state words and why a waiter waits
        for column in ("STATE", "WHY"):
            lines = colour.paint_column(lines, column, colour.state_colour)
    for line in lines:
        click.echo(line)


def format_ps(ps: dict, now: float, width: int | None = None) -> list[str]:
    from ..wire.requester import describe
    from .views.formats import (  # not for --json
        age,
        fit,
        format_command,
        format_groups,
        format_size,
        format_table,
        mem_now,
    )
    from .views.keys import format_keys, format_why

    slots = ps.get("slots", [])
    waits = ps.get("waits", [])
    tallies = ps.get("slot_keys")
    lines = []
    if tallies:  # each key's slots by state; free slots are only counted (supervisor.slots.views)
        states = ["free", "held", "reserved", "orphaned", "unreadable"]
        rows = [
            [t.get("key", "?"), str(t.get("cap", "?"))] + [str(t.get(s, 0)) for s in states]
            for t in tallies
        ]
        lines += format_table(
            ["KEY", "CAP", "FREE", "HELD", "RESERVED", "ORPHANED", "UNREADABLE"], rows
        )
        lines.append("")
    if slots:
        rows = [
            [
                s.get("key", "?") + (f" ({s['pool']})" if s.get("pool") else ""),
                str(s.get("index", "?")),
                str(s.get("cap", "?")),
                s.get("state", "?"),
                s.get("turn") or "-",
                describe(s.get("holder"), s.get("requester")),
                str(s.get("pid") or "-"),
                format_groups(s.get("groups")),
                age(s.get("since"), now),
                format_command(s.get("argv")) if s.get("turn") else "-",
            ]
            for s in slots
        ]
        header = ["KEY", "INDEX", "CAP", "STATE", "TURN", "HOLDER", "PID", "GROUPS", "AGE"]
        if any(mem_now(s) is not None or s.get("predicted_mem") for s in slots):
            # each running turn's whole tree now, and its key's predicted peak ([memory])
            header += ["MEM", "PRED"]
            for row, s in zip(rows, slots, strict=True):
                row[-1:-1] = [format_size(mem_now(s)), format_size(s.get("predicted_mem"))]
        lines += fit(format_table([*header, "COMMAND"], rows), width)
    else:
        lines.append("no slot taken" if tallies is not None else "no slots")
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
                format_command(w.get("argv")),
            ]
            for w in waits
        ]
        header = ["POS", "ID", "KEY", "HOLDER", "WAITING", "WHY", "COMMAND"]
        lines += fit(format_table(header, rows), width)
    else:
        lines.append("no one waiting")
    keys = format_keys(ps, now)  # paused keys and rate windows
    return lines + ([""] + keys if keys else [])
