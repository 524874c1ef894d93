"""`ccsup pause KEY (--for D | --until T) [--reason TEXT] [--json]`: grant nothing of KEY a while.

`--for` is a duration ("90s", "5m", "1h"); `--until` a local date and time
(`2026-12-01T10:00`, seconds and a UTC offset optional). A bare harness name pauses every key of
the harness. The supervisor caps every pause at now + `[slots] max_pause`, and the command says
so on a line of its own. A key that is neither configured nor known to the supervisor (no slot
files: it never ran here; not waiting) is refused with exit 2, a typo like `codx` being the
likely cause; `--force` pauses it anyway (exit 0, with a warning). `--json` prints the
supervisor's answer. Knows the CLI's words; the decisions are the supervisor's.
"""

from __future__ import annotations

import datetime as dt
import time

import click

from ..errors import UsageError
from .options import DURATION, complete_keys, key_option
from .views.keys import clock_time, known_key
from .where import emit_json, where


def parse_until(text: str) -> float:
    """Epoch seconds of a local ISO date-time (`2026-12-01T10:00`, offset optional)."""
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(
            f"--until {text!r} is not a date and time; write it like 2026-12-01T10:00"
        ) from None
    return when.timestamp()  # a naive time is local, as the user reads a clock


def _until(ctx, param, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return parse_until(value)
    except UsageError as e:
        raise click.BadParameter(e.message) from None


@click.command()
@click.argument("key", callback=key_option, shell_complete=complete_keys)
@click.option("--for", "for_", type=DURATION, metavar="D", help='How long: "90s", "5m".')
@click.option("--until", callback=_until, metavar="T", help="Until a local time: 2026-12-01T10:00.")
@click.option("--reason", help="Why (shown by ps and in the key.<key>.paused event).")
@click.option(
    "--force",
    is_flag=True,
    help="Pause a key that is neither configured nor has ever run here (else refused, exit 2).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the supervisor's answer as JSON.")
@click.pass_context
def pause(ctx, key: str, for_, until, reason, force: bool, as_json: bool) -> None:
    """Grant nothing of KEY for a while (running turns go on; waiters keep their places).

    A bare harness name (opencode) pauses all its keys. Several pauses end at the latest end,
    never later than now + [slots] max_pause (default 1h)."""
    if (for_ is None) == (until is None):
        raise click.UsageError("give exactly one of --for and --until")
    with where(ctx).client() as client:
        status = client.status()
        if "caps_in_force" in status and not known_key(key, status):
            problem = (
                f"{key} is not a configured key and has never run here "
                f"(known: {', '.join(sorted(e['key'] for e in status['caps_in_force'])) or 'none'})"
            )
            if not force:
                raise UsageError(f"{problem}; check the spelling, or give --force to pause it")
            click.echo(f"ccsup: warning: {problem}; pausing it anyway (--force)", err=True)
        asked = time.time() + for_ if for_ is not None else until
        answer = client.pause(key, for_=for_, until=until, reason=reason)
    if as_json:
        emit_json(answer)
        return
    click.echo(f"{key} paused until {clock_time(answer.get('until'))}")
    if answer.get("capped"):
        from .views.formats import format_age

        limit = answer.get("max_pause")
        click.echo(
            f"note: you asked until {clock_time(asked)}, but no pause may last longer than "
            f"[slots] max_pause ({format_age(limit) if limit else '?'}): it ends at "
            f"{clock_time(answer.get('until'))}"
        )
