"""`ccsup history`: finished turns, newest first, from the history file (supervisor.history.db).

It reads the file directly, read-only, so it works whether or not a supervisor runs on the state
directory (the history survives it). A state directory where no turn has run yet (no history
file) gives an empty table (`[]` with --json), exit 0. Exit codes: 0, 1 when the history cannot
be read, 2 for bad options.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from ..errors import CcsupError
from ..history import db as turn_history
from .options import DURATION, complete_keys, optional_key_option
from .views.records import format_history, format_leftover_counts
from .where import where


def _since_option(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    return None if value is None else time.time() - value


def _outcome_option(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> list[str] | None:
    wanted = [o for value in values for o in value.split(",") if o]
    unknown = sorted(set(wanted) - set(turn_history.OUTCOMES))
    if unknown:
        raise click.BadParameter(f"{unknown[0]!r}; known: {', '.join(turn_history.OUTCOMES)}")
    return wanted or None


@click.command()
@click.option(
    "--key",
    callback=optional_key_option,
    shell_complete=complete_keys,
    help="Only turns of this cap key.",
)
@click.option(
    "--since",
    type=DURATION,
    callback=_since_option,
    metavar="DURATION",
    help='Only turns that ended within this long ("1h", "30m").',
)
@click.option(
    "--outcome",
    "outcomes",
    multiple=True,
    callback=_outcome_option,
    help=f"Only these outcomes (repeat or comma-separate): {', '.join(turn_history.OUTCOMES)}.",
)
@click.option("--limit", type=click.IntRange(1, 1_000_000), default=100, show_default=True)
@click.option(
    "--leftovers",
    "sum_leftovers",
    is_flag=True,
    help="What turns left running when their command exited, summed per harness and name across "
    "turns (--key and --since filter; --outcome and --limit do not apply).",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of turn records.")
@click.pass_context
def history(
    ctx: click.Context,
    key: str | None,
    since: float | None,
    outcomes: list[str] | None,
    limit: int,
    sum_leftovers: bool,
    as_json: bool,
) -> None:
    """Finished turns, newest first: id, key, holder, outcome, times, what they used."""
    state_dir = where(ctx).state_dir()
    if sum_leftovers:
        _leftovers(state_dir, key, since, as_json)
        return
    records: list[turn_history.TurnRecord] = []
    if turn_history.history_path(state_dir).exists():  # else no turn ran here: an empty table
        try:
            records = turn_history.query(
                state_dir, key=key, since=since, outcomes=outcomes, limit=limit
            )
        except turn_history.HistoryError as e:
            raise CcsupError(e.message) from None
    if as_json:
        click.echo(json.dumps(records, ensure_ascii=False))
        return
    from .views.formats import terminal_width

    lines = format_history(records, terminal_width())
    from .views import colour

    if colour.enabled():  # exit 0 green, failures red
        lines = colour.paint_column(lines, "OUTCOME", colour.outcome_colour)
    for line in lines:
        click.echo(line)


def _leftovers(state_dir: Path, key: str | None, since: float | None, as_json: bool) -> None:
    counts: list[turn_history.LeftoverCount] = []
    if turn_history.history_path(state_dir).exists():
        try:
            counts = turn_history.leftovers(state_dir, key=key, since=since)
        except turn_history.HistoryError as e:
            raise CcsupError(e.message) from None
    if as_json:
        click.echo(json.dumps(counts, ensure_ascii=False))
        return
    from .views.formats import terminal_width

    for line in format_leftover_counts(counts, terminal_width()):
        click.echo(line)
