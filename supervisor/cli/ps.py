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
    from .formats import format_ps, terminal_width  # not for --json

    lines = format_ps(result, time.time(), terminal_width())
    if "cluster" in result:  # [cluster]: the cluster keys on every machine
        from .cluster_formats import format_cluster_ps

        lines += format_cluster_ps(result["cluster"], time.time())
    for line in lines:
        click.echo(line)
