"""`ccsup reload`: re-read the configuration (caps and graces; endpoints need a restart)."""

from __future__ import annotations

import click

from .where import emit_json, where


@click.command()
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def reload(ctx: click.Context, as_json: bool) -> None:
    """Re-read the configuration (caps and graces; endpoints need a restart)."""
    with where(ctx).client() as client:
        result = client.reload()
    if as_json:
        emit_json(result)
    else:
        click.echo(f"reloaded ({result.get('config', 'config')})")
