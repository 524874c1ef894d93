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
    default=None,
    help='How long to wait ("5s", "2m"; default 60s, and no limit with --drain).',
)
@click.option(
    "--drain",
    is_flag=True,
    help="Grant nothing new and let the running turns end on their own, then stop.",
)
@click.pass_context
def stop(ctx: click.Context, timeout: float | None, drain: bool) -> None:
    """Stop the supervisor: every turn ended and confirmed gone first; says what it ended.

    With --drain, nothing new is granted or taken and the running turns finish on their own
    first; the turns still waiting are then cancelled.

    \b
    Examples:
      ccsup stop --timeout 30s
      ccsup stop --drain           before an upgrade: let the work in progress finish"""
    from ..client.control import RemoteError
    from ..instance import lock_held

    options = where(ctx)
    limit = timeout if timeout is not None else (None if drain else 60.0)
    with options.client() as client:
        before = _busy(client)
        try:
            answer = client.quit(drain=drain)
        except RemoteError as e:
            if e.code != "stopping":
                raise
            answer = {}
        if drain and answer.get("running"):
            click.echo(
                f"draining: waiting for {answer['running']} running turn(s) to end", err=True
            )
        try:
            wait_until(
                lambda: not lock_held(client.paths.lock),
                limit if limit is not None else float("inf"),
                0.05,
            )
        except TimeoutError:
            what = "draining" if drain else "stopping"
            raise CcsupError(
                f"the supervisor on {client.state_dir} is still {what} after {limit:g} s; "
                + _still_running(client)
            ) from None
    click.echo(f"ccsup stopped (state {client.state_dir}){_ended(before, drain)}")


def _busy(client: Client) -> tuple[dict[str, int], int]:
    """What runs before the stop: running turns by key, and how many wait."""
    try:
        ps = client.ps()
    except CcsupError:
        return {}, 0
    running: dict[str, int] = {}
    for slot in ps.get("slots", []):
        if slot.get("turn") and slot.get("state") in (SlotState.HELD, SlotState.RESERVED):
            running[slot["key"]] = running.get(slot["key"], 0) + 1
    return running, len(ps.get("waits", []))


def _ended(before: tuple[dict[str, int], int], drain: bool) -> str:
    running, waiting = before
    parts = []
    if running:
        by_key = ", ".join(f"{key} {n}" for key, n in sorted(running.items()))
        verb = "finished while draining" if drain else "ended"
        parts.append(f"{sum(running.values())} running turn(s) {verb} ({by_key})")
    if waiting:
        parts.append(f"{waiting} waiting cancelled")
    return ": " + "; ".join(parts) if parts else ": nothing was running"


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
