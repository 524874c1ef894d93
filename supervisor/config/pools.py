"""`[pools]` and `[env."<key>"]`: account pools, and the environment a key's turns run with.

`[pools] NAME = ["member", ...]`: a turn asked for NAME runs on the first member, in the order
written, that may be granted (supervisor.turns.pools). What a pool and its members may be, each
checked here with the key and line of what is wrong:
- NAME is a cap key (`codex`, `accounts:all`) that no cap names: not in `[slots] caps` or
  `[cluster] caps`, itself or (for `h:v`) by its harness, and not a member of any pool;
- a member is named in `[slots] caps` (its cap written down), at most once in its pool and in one
  pool only, is not a pool itself, and is not a cluster key (`[cluster] caps`, itself or by its
  harness): a pool's members are this machine's keys;
- a pool has at least one member.

`[env."<key>"]`: variables a key's turns get, added after the caller's own (`CODEX_HOME`,
`CLAUDE_CONFIG_DIR`, ...), for a key named in `[slots] caps` or `[cluster] caps`. Each name is
a shell variable name, each value a string, taken as written except a leading `~` or `~/` (the
home directory, as `state_dir`'s; no `$VAR` expansion). The
values may be secrets: they are applied when a turn's guard is started and never written to a
record, an event, the history or queue.json (supervisor.turns.starting).

Pure: parsing only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ..caps import key_problem
from .schema import Checker, Key, Section, Table, kind, per_key
from .values import expand_home

SECTION = Section(
    ("pools",),
    "Account pools: a turn asked for the pool's name runs on the first member (in the order\n"
    "written) with a free slot and room (not paused, not held for quota); its waiters wait in\n"
    "one queue, oldest first. A member is a key of [slots] caps; it may be asked for directly\n"
    "too, and counts for both.",
    (
        Key(
            "claude",
            ["claude:work", "claude:home"],
            "A pool and its members (`ccsup run --key claude` runs on either account).",
            example=True,
        ),
    ),
    example=True,
)

ENV_SECTION = Section(
    ("env", "*"),
    "Environment of a key's turns (a pool member's account), added after the caller's own.\n"
    "Applied when a turn starts; never written to a record, an event or the history.",
    (
        Key(
            "CLAUDE_CONFIG_DIR",
            "/home/you/.claude-work",
            "A variable and its value (CODEX_HOME for a Codex account).",
            example=True,
        ),
    ),
    example=True,
    example_name='"claude:work"',
)

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class Pools:
    """`[pools]` (name -> members, in the order written) and `[env."<key>"]` (key -> variables)."""

    pools: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    env: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "pools", MappingProxyType(dict(self.pools)))
        env = {key: MappingProxyType(dict(names)) for key, names in self.env.items()}
        object.__setattr__(self, "env", MappingProxyType(env))


def _capped_by(key: str, caps: Mapping[str, int]) -> str | None:
    """The entry of `caps` that names `key`: itself, or its harness (for `h:v`)."""
    if key in caps:
        return key
    harness, sep, _ = key.partition(":")
    return harness if sep and harness in caps else None


def parse_pools(
    c: Checker,
    top: Table,
    caps: Mapping[str, int],
    cluster_caps: Mapping[str, int],
    env: Mapping[str, str] = {},
) -> Pools:
    """`caps`: `[slots] caps`; `cluster_caps`: `[cluster] caps` (empty without a cluster); `env`:
    the environment `~` is expanded from ($HOME)."""
    pools: dict[str, tuple[str, ...]] = {}
    entries = list(
        per_key(
            c.add,
            top,
            ("pools",),
            holds="pool = [members]",
            check_key=key_problem,
            bad_key="bad pool name",
        )
    )
    names = {name for name, _, _ in entries}
    member_of: dict[str, str] = {}  # member -> the pool that named it first
    for name, path, value in entries:
        ok = True
        capped = _capped_by(name, caps) or _capped_by(name, cluster_caps)
        if capped is not None:
            c.add(path, f"the pool {name} is named like a key that has a cap ({capped!r})")
            ok = False
        if not isinstance(value, list) or not value:
            shown = "an empty array" if value == [] else kind(value)
            c.add(path, f'must be an array of member keys, like ["codex:work"], not {shown}')
            continue
        members: list[str] = []
        for member in value:
            problem = _member_problem(member, names, members, member_of, caps, cluster_caps)
            if problem is not None:
                c.add(path, problem)
                ok = False
                continue
            members.append(member)
            member_of.setdefault(member, name)
        if ok:
            pools[name] = tuple(members)
    return Pools(pools, _parse_env(c, top, caps, cluster_caps, env))


def _member_problem(
    member: object,
    pools: set[str],
    before: list[str],
    member_of: Mapping[str, str],
    caps: Mapping[str, int],
    cluster_caps: Mapping[str, int],
) -> str | None:
    """Why `member` may not be a member of the pool (see the module's note), or None."""
    if not isinstance(member, str):
        return f"a member is a key (a string), not {kind(member)} ({member!r})"
    problem = key_problem(member)
    if problem is not None:
        return f"bad member {member[:140]!r}: {problem}"
    if member in before:
        return f"the member {member!r} is named twice"
    if member in pools:
        return f"the member {member!r} is a pool itself"
    if member in member_of:
        return f"the member {member!r} is already a member of the pool {member_of[member]!r}"
    clustered = _capped_by(member, cluster_caps)
    if clustered is not None:
        return (
            f"the member {member!r} is a cluster key ([cluster] caps {clustered!r}): "
            "a pool's members are this machine's keys"
        )
    if member not in caps:
        return f"unknown member {member!r}: a member is a key named in [slots] caps"
    return None


def _parse_env(
    c: Checker,
    top: Table,
    caps: Mapping[str, int],
    cluster_caps: Mapping[str, int],
    env: Mapping[str, str],
) -> dict[str, dict[str, str]]:
    found: dict[str, dict[str, str]] = {}
    for key, path, table in per_key(
        c.add,
        top,
        ("env",),
        holds='[env."<key>"] tables',
        check_key=key_problem,
        bad_key="bad key",
    ):
        if key not in caps and key not in cluster_caps:
            c.add(
                path,
                f"an [env] table for the key {key!r}, which no cap names"
                f" ([slots] caps or [cluster] caps)",
            )
            continue
        if not isinstance(table, dict):
            c.add(path, f'must be a table of NAME = "value", not {kind(table)}')
            continue
        names: dict[str, str] = {}
        for name, value in table.items():
            if not _ENV_NAME.match(name):
                c.add(path + (name,), f"bad variable name {name[:140]!r}: letters, digits, '_'")
            elif not isinstance(value, str):
                c.add(path + (name,), f"must be a string, not {kind(value)}")
            elif "\0" in value:
                c.add(path + (name,), "must not hold a NUL character")
            elif value == "~" or value.startswith("~/"):
                names[name] = str(expand_home(value, env))
            else:
                names[name] = value
        found[key] = names
    return found
