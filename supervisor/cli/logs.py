"""`ccsup logs`: print a turn's output log (exact bytes)."""

from __future__ import annotations

import sys

import click

from ..errors import CcsupError
from .options import turn_id_argument
from .output import OutputFollower
from .where import where


def _turn_active(ps: dict, turn_id: str) -> bool:
    return any(s.get("turn") == turn_id for s in ps.get("slots", [])) or any(
        w.get("id") == turn_id for w in ps.get("waits", [])
    )


@click.command()
@click.argument("turn_id", metavar="ID", callback=turn_id_argument)
@click.option(
    "-f",
    "--follow",
    is_flag=True,
    help="Keep printing until the turn ends or the supervisor is gone.",
)
@click.option(
    "--stderr", "use_stderr", is_flag=True, help="The turn's stderr instead of its stdout."
)
@click.pass_context
def logs(ctx: click.Context, turn_id: str, follow: bool, use_stderr: bool) -> None:
    """Print a turn's output log (exact bytes)."""
    from ..subscription import is_terminal

    options = where(ctx)
    stream = "stderr" if use_stderr else "stdout"
    client = options.client()
    try:
        path = client.paths.output_log(turn_id, stream)
        out = OutputFollower(path, sys.stdout.buffer)
        if follow and not client.running() and not path.exists():
            client.check_running()  # nothing to print and nothing to follow: NotRunning
        if not follow or not client.running():
            if not out.copy_from_file():
                raise CcsupError(f"unable to read the {stream} of turn {turn_id}: no file {path}")
            out.close()
            return
        with client.subscribe([f"turn.{turn_id}."]) as sub:
            if not _turn_active(client.ps(), turn_id) and not path.exists():
                raise CcsupError(
                    f"unable to follow turn {turn_id}: it is not running and has no {stream} log"
                )
            active = _turn_active(client.ps(), turn_id)
            out.drain()
            try:
                while active:
                    event = sub.recv(0.5)
                    out.drain()
                    if event is None:
                        active = client.running()
                    elif is_terminal(event[0]):
                        break
            except KeyboardInterrupt:
                ctx.exit(130)
            out.drain()
            out.close()
    finally:
        client.close()
