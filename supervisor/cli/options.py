"""Option types and callbacks more than one command uses: durations, cap keys (and key
patterns), turn ids.

One grammar for time: every option that takes a length of time takes a `DURATION`, parsed by the
config's duration parser ("2s", "500ms", "5m", "1h", or a bare number of seconds: "0.5"), so
`--wait-timeout 2s`, `stop --timeout 5s` and `run --timeout 2s` read alike."""

from __future__ import annotations

import click

from ..errors import UsageError


class Duration(click.ParamType):
    """A length of time in seconds, from "2s", "500ms", "5m", "1h" or "0.5"; more than zero."""

    name = "duration"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None):
        if isinstance(value, float):  # a default, already seconds
            return value
        from ..config.values import duration

        try:
            return duration(value, where="")
        except UsageError as e:
            self.fail(e.message.removeprefix(": "), param, ctx)


DURATION = Duration()


def key_patterns_option(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> list[str] | None:
    """Repeatable `--key`: cap keys, or shell globs of them (`'opencode:*'`); None when none."""
    from ..caps import check_key

    patterns = []
    for value in values:
        if any(c in value for c in "*?["):
            patterns.append(value)
            continue
        try:
            patterns.append(check_key(value, reserved_ok=True))
        except UsageError as e:
            raise click.BadParameter(e.message) from None
    return patterns or None


def key_matches(key: str, patterns: list[str] | None) -> bool:
    from fnmatch import fnmatchcase

    return patterns is None or any(fnmatchcase(key, p) for p in patterns)


def key_option(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A cap key, checked as the supervisor checks it (caps.py)."""
    from ..caps import check_key

    try:
        return check_key(value)
    except UsageError as e:
        raise click.BadParameter(e.message) from None


def optional_key_option(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> str | None:
    return None if value is None else key_option(ctx, param, value)


def turn_id_argument(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A turn id, or a unique prefix of one (supervisor.cli.ids): the whole id."""
    from ..paths import TURN_ID

    if not TURN_ID.match(value):
        raise click.BadParameter(
            f"{value!r} is not a turn id (1 to 128 letters, digits, '_' or '-')"
        )
    if ctx.resilient_parsing:  # completing the command line: nothing is looked up yet
        return value
    from .ids import resolve

    return resolve(ctx, value)  # a unique prefix names its turn (supervisor.cli.ids)


def complete_ids(ctx: click.Context, param: click.Parameter, incomplete: str) -> list:
    """Shell completion of turn ids (supervisor.cli.ids, imported only when completing)."""
    from . import ids

    return ids.complete_ids(ctx, param, incomplete)


def complete_keys(ctx: click.Context, param: click.Parameter, incomplete: str) -> list:
    """Shell completion of cap keys (supervisor.cli.ids, imported only when completing)."""
    from . import ids

    return ids.complete_keys(ctx, param, incomplete)
