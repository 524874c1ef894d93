"""`ccsup resume KEY [--reason TEXT] [--json]`: end KEY's pause now (a bare harness name: its
keys' pauses too). A key whose harness is still paused says so."""

from __future__ import annotations

import click

from .options import complete_keys, key_option
from .views.keys import clock_time
from .where import emit_json, where


@click.command()
@click.argument("key", callback=key_option, shell_complete=complete_keys)
@click.option("--reason", help='Said in the key.<key>.resumed event (default "resumed").')
@click.option("--json", "as_json", is_flag=True, help="Print the supervisor's answer as JSON.")
@click.pass_context
def resume(ctx, key: str, reason, as_json: bool) -> None:
    """End KEY's pause now (a bare harness name: its keys' pauses too)."""
    with where(ctx).client() as client:
        answer = client.resume(key, reason=reason)
    if as_json:
        emit_json(answer)
        return
    resumed = answer.get("resumed") or []
    click.echo(f"resumed {', '.join(resumed)}" if resumed else f"{key} was not paused")
    still = answer.get("still_paused")
    if still:
        click.echo(f"{key} is still paused as {still['key']} until {clock_time(still['until'])}")
