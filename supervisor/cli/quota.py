"""`ccsup quota [KEY] [--json]`, `ccsup quota set KEY --window W --used F --resets-at T`,
`ccsup quota clear KEY [--window W]`: a key's provider windows, shown, told or forgotten.

A window is `{window, used, resets_at, source, seen_at}` (supervisor.admission.quota). A key
with a window at or past `[quota] hold_at` grants nothing until that window resets; `set` is how
a person (or a script) tells the supervisor what the provider's page says, `clear` forgets what
was read (the key is free again at once). `--used` is a fraction (0.97) or a percent (97%);
`--resets-at` a local time of day (15:00: today, or tomorrow when that is past), a local date and
time (2026-12-07T15:00), `+D` (a duration from now: +90s, +2h) or epoch seconds. A key that is
neither configured nor known to the supervisor is refused (exit 2). Knows the CLI's words; the
checks of a reading and the decisions are the supervisor's.
"""

from __future__ import annotations

import datetime as dt
import time

import click

from ..errors import UsageError
from .options import complete_keys, key_option
from .views.keys import format_window
from .where import emit_json, where


def parse_resets_at(text: str, now: float | None = None) -> float:
    """Epoch seconds of `--resets-at`: HH:MM[:SS] (next one), an ISO date-time, +D, or epoch."""
    now = time.time() if now is None else now
    text = text.strip()
    if text.startswith("+"):
        from ..config.values import duration

        try:
            return now + duration(text[1:], where="--resets-at")
        except Exception as e:  # noqa: BLE001 -- ConfigError or UsageError: both name the value
            raise UsageError(f"--resets-at {text!r}: {getattr(e, 'message', e)}") from None
    try:
        return float(text)  # epoch seconds
    except ValueError:
        pass
    try:
        return _clock(text, now)
    except ValueError:
        raise UsageError(
            f"--resets-at {text!r} is not a time: write 15:00, 2026-12-07T15:00, +2h or"
            " epoch seconds"
        ) from None


def _clock(text: str, now: float) -> float:
    if "T" in text or "-" in text:
        return dt.datetime.fromisoformat(text).timestamp()  # a naive time is local
    of_day = dt.time.fromisoformat(text)
    today = dt.datetime.fromtimestamp(now).date()
    when = dt.datetime.combine(today, of_day).timestamp()
    return (
        when
        if when > now
        else dt.datetime.combine(today + dt.timedelta(days=1), of_day).timestamp()
    )


def parse_used(text: str) -> float:
    """0.97 or 97%: a fraction (its range is the supervisor's to check, and name)."""
    try:
        if text.strip().endswith("%"):
            return float(text.strip()[:-1]) / 100.0
        return float(text)
    except ValueError:
        raise UsageError(f"--used {text!r} is not a fraction (0.97) nor a percent (97%)") from None


class _QuotaGroup(click.Group):
    """`ccsup quota KEY` shows KEY; `ccsup quota set|clear ...` are subcommands."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            ctx.meta["quota_key"] = args[0]
            args = args[1:]
        return super().parse_args(ctx, args)


@click.group(cls=_QuotaGroup, invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Print the supervisor's answer as JSON.")
@click.pass_context
def quota(ctx, as_json: bool) -> None:
    """A key's provider usage windows: `ccsup quota [KEY]` shows them (every key with one, or
    KEY's); `set` tells one, `clear` forgets them. A window at or past [quota] hold_at holds the
    key's grants until it resets (running turns go on)."""
    if ctx.invoked_subcommand is not None:
        return
    key = ctx.meta.get("quota_key")
    with where(ctx).client() as client:
        answer = client.call("quota", action="show", **({"key": key} if key else {}))
    if as_json:
        emit_json(answer)
        return
    _print(answer)


def _print(answer: dict) -> None:
    now = time.time()
    keys = answer.get("keys") or []
    if not keys:
        click.echo("no key has a window")
    for entry in keys:
        held = entry.get("held")
        state = (
            f"held until the {held['window']} window resets"
            if held
            else f"room (holds at {answer.get('hold_at', 0.95) * 100:.0f}%)"
        )
        click.echo(f"{entry['key']}: {state}")
        for window in entry.get("windows") or []:
            click.echo(f"  {format_window(window, now)}")
    if answer.get("skipped"):
        click.echo(f"{answer['skipped']} reading(s) skipped (malformed or out of range)")


@quota.command("set")
@click.argument("key", callback=key_option, shell_complete=complete_keys)
@click.option("--window", required=True, metavar="W", help='The window: "5h", "7d", "day".')
@click.option("--used", required=True, metavar="F", help="The used fraction (0.97) or 97%.")
@click.option(
    "--resets-at", "resets_at", required=True, metavar="T", help="15:00, +2h, or a date-time."
)
@click.option("--json", "as_json", is_flag=True, help="Print the supervisor's answer as JSON.")
@click.pass_context
def quota_set(ctx, key: str, window: str, used: str, resets_at: str, as_json: bool) -> None:
    """Tell the supervisor where one of KEY's windows stands."""
    args = {"key": key, "window": window, "used": parse_used(used)}
    args["resets_at"] = parse_resets_at(resets_at)
    with where(ctx).client() as client:
        answer = client.call("quota", action="set", **args)
    if as_json:
        emit_json(answer)
        return
    _print({"keys": [answer], "hold_at": answer.get("hold_at")})


@quota.command("clear")
@click.argument("key", callback=key_option, shell_complete=complete_keys)
@click.option("--window", metavar="W", help="Only this window (default: every one).")
@click.option("--json", "as_json", is_flag=True, help="Print the supervisor's answer as JSON.")
@click.pass_context
def quota_clear(ctx, key: str, window: str | None, as_json: bool) -> None:
    """Forget KEY's windows (or one): its grants are no longer held for them."""
    with where(ctx).client() as client:
        answer = client.call(
            "quota", action="clear", key=key, **({"window": window} if window else {})
        )
    if as_json:
        emit_json(answer)
        return
    cleared = answer.get("cleared") or []
    click.echo(f"{key}: {'forgot ' + ', '.join(cleared) if cleared else 'had no window'}")


STATUSLINE_MAX = 1 << 20  # a status-line payload is a few KiB
OWN_COMMAND_TIMEOUT = 10.0


@quota.command("statusline", context_settings={"ignore_unknown_options": True})
@click.option(
    "--key", default="claude", show_default=True, help="The key of the session's account."
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def quota_statusline(ctx, key: str, command: tuple[str, ...]) -> None:
    """A Claude Code status-line command: what the session says of its usage windows (its
    `rate_limits`) is told to KEY's windows, then your own status-line COMMAND runs with the same
    input and its output is shown. Never fails the status line: a payload that cannot be read, or
    no supervisor, changes nothing.

    \b
    In ~/.claude/settings.json:
      "statusLine": {"type": "command",
                     "command": "ccsup quota statusline --key claude -- ~/bin/my-status"}"""
    import subprocess
    import sys

    from ..admission.quota_signals import SignalError, claude_statusline
    from ..errors import CcsupError

    payload = sys.stdin.buffer.read(STATUSLINE_MAX)
    try:
        readings = claude_statusline(payload)
    except SignalError:
        readings = []  # skipped: the status line still shows
    if readings:
        try:
            with where(ctx).client() as client:
                for r in readings:
                    try:
                        client.call("quota", action="set", key=key, window=r.window, used=r.used,
                                    resets_at=r.resets_at, source=r.source)  # fmt: skip
                    except CcsupError:
                        continue  # one the supervisor refuses (an old reset): the next is read
        except CcsupError:
            pass  # no supervisor here: nothing to tell
    if command:
        try:
            done = subprocess.run(
                list(command), input=payload, capture_output=True, timeout=OWN_COMMAND_TIMEOUT
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            click.echo(f"ccsup: your status-line command: {e}", err=True)
            return
        sys.stdout.buffer.write(done.stdout)
        sys.stdout.flush()
        ctx.exit(done.returncode)
