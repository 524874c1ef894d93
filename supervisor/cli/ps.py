"""`ccsup ps [--json]`: slots by key, then the waiters in order."""

from __future__ import annotations

import time

import click

from .where import emit_json, where


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print exactly the ps result as JSON.")
@click.pass_context
def ps(ctx: click.Context, as_json: bool) -> None:
    """Slots by key (state, turn, holder, pid, groups, age), then the waiters in order."""
    with where(ctx).client() as client:
        result = client.ps()
    if as_json:
        emit_json(result)
        return
    from .formats import format_ps  # not for --json

    for line in format_ps(result, time.time()):
        click.echo(line)
