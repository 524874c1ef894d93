"""`ccsup cancel ID`: cancel a turn in any state (a running one is stopped and released once gone).

A turn that had already finished is said to have finished, with its outcome from the history
(`turn X had already finished (exit 0, released); nothing to cancel`), and the command exits 0: cancel is idempotent, so a
retried cancel, or one that lost a race with the turn's end, is not a failure. An id the
supervisor has never seen (or forgot: finished ids are kept at least 10 minutes) exits 1 with
the words every command uses for an unknown id (supervisor.errors.UnknownTurn).
"""

from __future__ import annotations

import click

from .options import complete_ids, turn_id_argument
from .where import emit_json, where


@click.command()
@click.argument("turn_id", metavar="ID", callback=turn_id_argument, shell_complete=complete_ids)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def cancel(ctx: click.Context, turn_id: str, as_json: bool) -> None:
    """Cancel a turn in any state (a running one is stopped and released once gone).

    A turn that had already finished is left as it is: the command says so, and exits 0."""
    from ..client.control import RemoteError
    from ..errors import UnknownTurn

    place = where(ctx)
    with place.client() as client:
        try:
            result = client.cancel(turn_id)
        except RemoteError as e:
            if e.code != "not_found":
                raise
            raise UnknownTurn(turn_id, place.state_dir()) from None
    if as_json:
        emit_json(result)
    elif result.get("finished"):
        outcome = _outcome(place, turn_id, result)
        click.echo(f"turn {turn_id} had already finished ({outcome}); nothing to cancel")
    else:
        click.echo(f"turn {turn_id}: {result.get('state', 'cancelling')}")


def _outcome(place, turn_id: str, result: dict) -> str:
    """The finished turn's outcome from the history (`exit 0`, `signal 9`, `cancelled`), else
    its terminal state."""
    from ..history import db as history
    from .views.records import outcome_text

    try:
        story = history.show(place.state_dir(), turn_id)
    except history.HistoryError:
        story = None
    if story is None:
        return str(result.get("state"))
    return f"{outcome_text(story)}, {story['state']}"
