"""`ccsup cancel`: cancel a turn in any state (a running one is stopped and released once gone)."""

from __future__ import annotations

import click

from .options import turn_id_argument
from .where import emit_json, where


@click.command()
@click.argument("turn_id", metavar="ID", callback=turn_id_argument)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def cancel(ctx: click.Context, turn_id: str, as_json: bool) -> None:
    """Cancel a turn in any state (a running one is stopped and released once gone)."""
    with where(ctx).client() as client:
        result = client.cancel(turn_id)
    if as_json:
        emit_json(result)
    else:
        click.echo(f"turn {turn_id}: {result.get('state', 'cancelling')}")
