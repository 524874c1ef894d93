"""`ccsup logs`: print a turn's output log (exact bytes), or with -t each line with its time.

-t reads the time index beside the log (supervisor.output.line_times) and puts the time a line started to
arrive before it; the bytes are the log's. A turn whose logs were pruned ([logs] keep or
max_bytes) is reported as pruned, with when and why (supervisor.output.retention's marker).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from ..errors import CcsupError, UsageError
from .options import turn_id_argument
from .output import OutputFollower
from .where import where


def _refuse_pruned(turn_id: str, path: Path) -> None:
    """A turn whose logs were pruned: say so, when and why (CcsupError)."""
    from ..output.retention import marker_of

    marker = marker_of(path.parent)
    if marker is None:
        return
    when = marker.get("pruned_at")
    shown = (
        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when))
        if isinstance(when, (int, float))
        else "an unknown time"
    )
    raise CcsupError(
        f"turn {turn_id}: its logs were pruned at {shown} ({marker.get('reason', 'unknown')}); "
        "see [logs] keep and max_bytes"
    )


def _print_timed(turn_id: str, stream: str, path: Path) -> None:
    from ..output.line_times import timed_chunks, timed_lines

    if not path.exists():
        raise CcsupError(f"unable to read the {stream} of turn {turn_id}: no file {path}")
    out = sys.stdout.buffer
    try:
        for piece in timed_lines(timed_chunks(path, path.with_suffix(".idx"))):
            out.write(piece)
    except OSError as e:
        raise CcsupError(f"unable to read {path}: {e.strerror}") from None
    out.flush()


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
@click.option(
    "-t",
    "--timestamps",
    is_flag=True,
    help="Put the time each line started to arrive before it (from the log's index).",
)
@click.pass_context
def logs(
    ctx: click.Context, turn_id: str, follow: bool, use_stderr: bool, timestamps: bool
) -> None:
    """Print a turn's output log (exact bytes)."""
    from ..client.subscription import is_terminal

    options = where(ctx)
    stream = "stderr" if use_stderr else "stdout"
    client = options.client()
    try:
        path = client.paths.output_log(turn_id, stream)
        _refuse_pruned(turn_id, path)
        if timestamps:
            if follow:
                raise UsageError("-t prints a finished log; it does not follow (-f)")
            _print_timed(turn_id, stream, path)
            return
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
