"""`ccsup show ID`: one turn's whole record, running or finished, from the history file.

The supervisor records each lifecycle event as it publishes it, so a running turn is there too.
Reads the file directly (no supervisor needed). Exit codes: 0, 1 when the history cannot be read
or does not know the turn, 2 for a bad id.
"""

from __future__ import annotations

import json

import click

from ..errors import CcsupError, UnknownTurn
from ..history import db as history
from .options import complete_ids, turn_id_argument
from .views.records import format_story
from .where import where


@click.command()
@click.argument("turn_id", metavar="ID", callback=turn_id_argument, shell_complete=complete_ids)
@click.option("--json", "as_json", is_flag=True, help="Print the record (with its events) as JSON.")
@click.pass_context
def show(ctx: click.Context, turn_id: str, as_json: bool) -> None:
    """One turn's whole record, running or finished: outcome, times, usage, every event."""
    state_dir = where(ctx).state_dir()
    try:
        story = history.show(state_dir, turn_id)
    except history.HistoryError as e:
        raise CcsupError(e.message) from None
    if story is None:
        raise UnknownTurn(turn_id, state_dir)
    if as_json:
        click.echo(json.dumps(story, ensure_ascii=False))
        return
    for line in format_story(story):
        click.echo(line)
