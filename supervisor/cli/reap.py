"""`ccsup reap`: end the work of orphaned slots, confirm it gone, and free them."""

from __future__ import annotations

import click

from .options import optional_key_option
from .where import emit_json, where


@click.command()
@click.option(
    "--key",
    callback=optional_key_option,
    help="Only this key.",
)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def reap(ctx: click.Context, key: str | None, as_json: bool) -> None:
    """End the work of orphaned slots, confirm it gone, and free them."""
    with where(ctx).client(timeout=60.0) as client:
        result = client.reap(key)
    if as_json:
        emit_json(result)
        return
    reaped = result.get("reaped", [])
    if not reaped:
        click.echo("nothing to reap")
    for slot in reaped:
        click.echo(
            f"reaped {slot.get('key', '?')}[{slot.get('index', '?')}] (turn {slot.get('turn') or '-'})"
        )
