"""Turn ids people can type: a unique prefix names a turn; shell completion of ids and keys.

Design note. The prefix is resolved here, in the CLI, not in the supervisor: `show` and `logs`
read files and work without a supervisor, and the supervisor forgets finished ids after a while
while the history and the logs keep them. The ids a prefix may name are the live ones (`ps`: the
slots' turns and the waiters, when a supervisor runs), the history's (any that starts so, by a
range on its primary key) and the turns' log directories. An id given whole (one of those, or 32
hex digits, the form `ccsup run` and the clients make) is taken as it is, without asking; one that
names nothing is passed on unchanged, so the command says "no turn X" as before. A prefix of
several gets a usage error (exit 2) listing them. Completion offers the same ids, newest live
ones first, and the keys `ps` knows.

Knows the history's ids, the state directory's turns/ and `ps`; nothing of what a command does
with the id. Reads only.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from .where import Where

_WHOLE = re.compile(r"[0-9a-f]{32}")
SHOWN = 8  # matches listed in an ambiguity error


def _where(ctx: click.Context) -> Where:
    """The command's Where; during completion (the group's callback does not run) made from the
    root's options as parsed so far."""
    from .where import Where

    found = ctx.find_object(Where)
    if found is not None:
        return found
    root = ctx.find_root().params
    return Where(root.get("state_dir"), root.get("config"))


def _live(where: Where) -> tuple[list[str], list[str]]:
    """The live turn ids (slots, then waiters) and the keys a running supervisor's ps shows."""
    from ..errors import CcsupError

    try:
        with where.client(timeout=2.0) as client:
            ps = client.ps()
    except CcsupError:
        return [], []
    ids = [s["turn"] for s in ps.get("slots", []) if s.get("turn")]
    ids += [w["id"] for w in ps.get("waits", []) if w.get("id")]
    keys = [t["key"] for t in ps.get("slot_keys") or [] if t.get("key")]
    keys += [s["key"] for s in ps.get("slots", []) if s.get("key")]
    return ids, list(dict.fromkeys(keys))


def _stored(where: Where, prefix: str, limit: int) -> list[str]:
    """Ids starting with prefix in the history and among the turns' log directories."""
    from ..errors import CcsupError
    from ..history import db as history

    try:
        state_dir = where.state_dir()
    except CcsupError:
        return []
    found: list[str] = []
    try:
        found += history.ids_with_prefix(state_dir, prefix, limit)
    except history.HistoryError:
        pass
    try:
        found += [n for n in os.listdir(state_dir / "turns") if n.startswith(prefix)][:limit]
    except OSError:
        pass
    return found


def resolve(ctx: click.Context, value: str) -> str:
    """The whole id `value` names: itself when whole or unknown, else the one id it begins."""
    if _WHOLE.fullmatch(value):
        return value
    where = _where(ctx)
    live, _ = _live(where)
    candidates = dict.fromkeys([*live, *_stored(where, value, 100)])
    if value in candidates:
        return value
    matches = [i for i in candidates if i.startswith(value)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        return value
    shown = ", ".join(matches[:SHOWN]) + (
        f" and {len(matches) - SHOWN} more" if len(matches) > SHOWN else ""
    )
    raise click.BadParameter(
        f"{value!r} is the start of {len(matches)} turn ids: {shown}; type more of it"
    )


def complete_ids(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[click.shell_completion.CompletionItem]:
    from click.shell_completion import CompletionItem

    where = _where(ctx)
    live, _ = _live(where)
    ids = dict.fromkeys([i for i in live if i.startswith(incomplete)])
    ids.update(dict.fromkeys(_stored(where, incomplete, 50)))
    return [CompletionItem(i) for i in ids]


def complete_keys(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[click.shell_completion.CompletionItem]:
    from click.shell_completion import CompletionItem

    _, keys = _live(_where(ctx))
    return [CompletionItem(k) for k in keys if k.startswith(incomplete)]
