"""`ccsup pause KEY (--for D | --until T) [--reason TEXT]` and `ccsup resume KEY`, and the lines
`ps` and `status` print about paused keys, rate windows and why each waiter waits.

`--for` is a duration ("90s", "5m", "1h"); `--until` a local date and time
(`2026-12-01T10:00`, seconds and a UTC offset optional). A bare harness name pauses every key of
the harness. The supervisor caps every pause at now + `[slots] max_pause` and says so. `--json`
prints the supervisor's answer. Knows the CLI's words; the decisions are the supervisor's.
"""

from __future__ import annotations

import datetime as dt
import json
import time

import click

from .errors import UsageError


def _key(ctx, param, value: str) -> str:
    from .caps import check_key

    try:
        return check_key(value)
    except UsageError as e:
        raise click.BadParameter(e.message) from None


def _duration(ctx, param, value: str | None) -> float | None:
    if value is None:
        return None
    from .config import parse_duration

    try:
        return parse_duration(value, where="--for")
    except UsageError as e:
        raise click.BadParameter(e.message) from None


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


def _clock(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return dt.datetime.fromtimestamp(epoch).isoformat(sep=" ", timespec="seconds")


def _in(epoch: float | None, now: float) -> str:
    if epoch is None:
        return ""
    left = max(epoch - now, 0.0)
    return f" (in {left:.0f}s)" if left < 120 else f" (in {left / 60:.0f}m)"


@click.command()
@click.argument("key", callback=_key)
@click.option("--for", "for_", callback=_duration, metavar="D", help='How long: "90s", "5m".')
@click.option("--until", callback=_until, metavar="T", help="Until a local time: 2026-12-01T10:00.")
@click.option("--reason", help="Why (shown by ps and in the key.<key>.paused event).")
@click.option("--json", "as_json", is_flag=True, help="Print the supervisor's answer as JSON.")
@click.pass_context
def pause(ctx, key: str, for_, until, reason, as_json: bool) -> None:
    """Grant nothing of KEY for a while (running turns go on; waiters keep their places).

    A bare harness name (opencode) pauses all its keys. Several pauses end at the latest end,
    never later than now + [slots] max_pause (default 1h)."""
    from .cli import _where

    if (for_ is None) == (until is None):
        raise click.UsageError("give exactly one of --for and --until")
    with _where(ctx).client() as client:
        answer = client.pause(key, for_=for_, until=until, reason=reason)
    if as_json:
        click.echo(json.dumps(answer))
        return
    capped = " (capped by max_pause)" if answer.get("capped") else ""
    click.echo(f"{key} paused until {_clock(answer.get('until'))}{capped}")


@click.command()
@click.argument("key", callback=_key)
@click.option("--reason", help='Said in the key.<key>.resumed event (default "resumed").')
@click.option("--json", "as_json", is_flag=True, help="Print the supervisor's answer as JSON.")
@click.pass_context
def resume(ctx, key: str, reason, as_json: bool) -> None:
    """End KEY's pause now (a bare harness name: its keys' pauses too)."""
    from .cli import _where

    with _where(ctx).client() as client:
        answer = client.resume(key, reason=reason)
    if as_json:
        click.echo(json.dumps(answer))
        return
    resumed = answer.get("resumed") or []
    click.echo(f"resumed {', '.join(resumed)}" if resumed else f"{key} was not paused")
    still = answer.get("still_paused")
    if still:
        click.echo(f"{key} is still paused as {still['key']} until {_clock(still['until'])}")


def format_keys(result: dict, now: float | None = None) -> list[str]:
    """The lines about paused and rate-held keys (for ps and status); none when there are none."""
    now = time.time() if now is None else now
    lines = []
    for entry in result.get("keys") or []:
        pause, next_grant = entry.get("paused"), entry.get("next_grant")
        if pause:
            why = f": {pause['reason']}" if pause.get("reason") else ""
            by = f" by {pause['by']}" if pause.get("by") else ""
            lines.append(
                f"{entry['key']} paused until {_clock(pause['until'])}"
                f"{_in(pause['until'], now)}{by}{why}"
            )
        if next_grant:
            lines.append(
                f"{entry['key']} next grant at {_clock(next_grant)}{_in(next_grant, now)} (rate)"
            )
    return lines


def format_why(why: dict | None, now: float) -> str:
    """One waiter's reason, as the WHY column of ps shows it."""
    if not why:
        return "-"
    until = f" until {_clock(why['until'])}" if why.get("until") else ""
    return f"{why['reason']}{until}"
