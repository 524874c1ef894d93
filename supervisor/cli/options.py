"""Option and argument callbacks more than one command uses: cap keys and turn ids."""

from __future__ import annotations

import click

from ..errors import UsageError


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
    from ..paths import TURN_ID

    if not TURN_ID.match(value):
        raise click.BadParameter(
            f"{value!r} is not a turn id (1 to 128 letters, digits, '_' or '-')"
        )
    return value
