"""`ccsup ps [--key K]... [--json]`: slots by key, then the waiters in order; `--key` keeps only
the keys it names or matches (a shell glob), in the table and in --json alike."""

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
                result[part] = [e for e in result[part] if key_matches(e.get("key", ""), keys)]
    if as_json:
        emit_json(result)
        return
    from .formats import format_ps, terminal_width  # not for --json

    lines = format_ps(result, time.time(), terminal_width())
    if "cluster" in result:  # [cluster]: the cluster keys on every machine
        from .cluster_formats import format_cluster_ps

        lines += format_cluster_ps(result["cluster"], time.time())
    from . import colour

    if colour.enabled():  # state words and why a waiter waits
        for column in ("STATE", "WHY"):
            lines = colour.paint_column(lines, column, colour.state_colour)
    for line in lines:
        click.echo(line)
