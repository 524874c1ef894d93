"""`ccsup stop`: stop the supervisor, every turn ended and confirmed gone first."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from ..caps import SlotState
from ..errors import CcsupError
from ..polling import wait_until
from .options import DURATION
from .where import where

if TYPE_CHECKING:
    from ..client.control import Client


@click.command()
@click.option(
    "--timeout",
    type=DURATION,
    default="60s",
    show_default=True,
    help='How long to wait for every turn to end ("5s", "2m").',
)
@click.pass_context
def stop(ctx: click.Context, timeout: float) -> None:
    """Stop the supervisor: every turn ended and confirmed gone first."""
    from ..client.control import RemoteError
    from ..instance import lock_held

    options = where(ctx)
    with options.client() as client:
        try:
            client.quit()
        except RemoteError as e:
            if e.code != "stopping":
                raise
        try:
            wait_until(lambda: not lock_held(client.paths.lock), timeout, 0.05)
        except TimeoutError:
            raise CcsupError(
                f"the supervisor on {client.state_dir} is still stopping after {timeout:g} s; "
                + _still_running(client)
            ) from None
    click.echo(f"ccsup stopped (state {client.state_dir})")


def _still_running(client: Client) -> str:
    try:
        ps = client.ps()
    except CcsupError as e:
        return f"unable to ask it what still runs: {e.message}"
    busy = [
        f"{s['key']}[{s['index']}] {s['state']} turn {s.get('turn') or '-'} (guard pid {s.get('pid') or '-'})"
        for s in ps.get("slots", [])
        if s.get("state") != SlotState.FREE
    ]
    return "still running: " + (
        "; ".join(busy) if busy else "no slot is held (it is finishing its shutdown)"
    )
