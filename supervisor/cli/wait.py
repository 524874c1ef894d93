"""`ccsup wait ID`: wait for a turn's end, print its output, exit with its status.

What a model runs after the hook queued its command ("queued as <id>, position N; run: ccsup wait
<id>"), and what a script runs for a turn another process asked for. It never runs anything: it
follows the turn by id (supervisor.agents.turns), so running it again, or twice at once, is safe.
The output is the turn's whole stdout and stderr logs, printed once it has ended (byte for byte).

Exit codes: the command's own (128+N for a signal N), supervisor.cli.run.exits's 124 (its runtime
limit), 69 (cancelled), 65 (rejected), 125 (guard lost); 75 when --timeout ran out first (the turn
goes on: run `ccsup wait ID` again); 1 for an unknown id (supervisor.errors.UnknownTurn, as
show, logs and cancel); 3 with no supervisor running and the
turn not known to have been in one's care; 71 when its supervisor died and none answered again
within adopt_within + 5 s.

It rides through a supervisor's death as `ccsup run` does: a SIGKILLed supervisor, and one started
again within adopt_within + 5 s, change nothing in what it prints or its exit status. Run while no
supervisor runs, for a turn the history knows and has not seen end, it waits that long for one
(adopt_within from the configuration this command reads). An ended turn needs no supervisor: its
end is in the history and its output in the logs. It needs nothing from PATH.
"""

from __future__ import annotations

import sys

import click

from .options import DURATION, complete_ids, turn_id_argument
from .where import emit_json, where

FOREVER = 366 * 24 * 3600.0


def ended_status(view: dict) -> int:
    from .run.exits import EXIT_CANCELLED, EXIT_LOST, EXIT_REJECTED, EXIT_TIMEOUT

    outcome = view.get("outcome")
    if outcome == "rejected":
        return EXIT_REJECTED
    if outcome == "cancelled":
        return EXIT_CANCELLED
    if outcome == "timeout":
        return EXIT_TIMEOUT
    if view.get("signal"):
        return 128 + int(view["signal"])
    code = view.get("exit_code")
    return int(code) if isinstance(code, int) else EXIT_LOST


@click.command()
@click.argument("turn_id", metavar="ID", callback=turn_id_argument, shell_complete=complete_ids)
@click.option(
    "--timeout",
    type=DURATION,
    help="Stop waiting after this long (30s, 5m, or seconds; exit 75: the turn goes on).",
)
@click.option("--json", "as_json", is_flag=True, help="Print where the turn stands as JSON.")
@click.pass_context
def wait(ctx: click.Context, turn_id: str, timeout: float | None, as_json: bool) -> None:
    """Wait for turn ID to end, print its output, and exit with its status."""
    import asyncio

    from ..agents import turns
    from ..client.ride_through import RETURN_MARGIN
    from .run.exits import EXIT_WAIT_TIMEOUT

    down_wait = where(ctx).config().adopt_within + RETURN_MARGIN
    with where(ctx).client() as client:
        view = asyncio.run(turns.follow(client, turn_id, timeout or FOREVER, down_wait=down_wait))
        if as_json:
            emit_json(dict(view))
        elif view["state"] == "ended":
            for stream in ("stdout", "stderr"):
                out = getattr(sys, stream).buffer
                path = client.paths.output_log(turn_id, stream)
                if path.exists():
                    out.write(path.read_bytes())
                    out.flush()
    if view["state"] != "ended":
        where_ = f" at position {view['position']}" if view.get("position") else ""
        click.echo(
            f"ccsup: turn {turn_id} is still {view['state']}{where_}; run: ccsup wait {turn_id}",
            err=True,
        )
        ctx.exit(EXIT_WAIT_TIMEOUT)
    ctx.exit(ended_status(dict(view)))
