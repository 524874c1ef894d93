"""What `ccsup status` and `ccsup show` say of the cluster: the shapes and how they are built.

What it knows: the shapes of a cluster key's view (holders on every machine, waiters in cluster
order, this machine's waiters with their places) and of the cluster's status, and how to build
them from a read of the queue keys and from the lease keeper. What it does not know: how the
queue is read (the gate reads it and passes the keys), grants, the watch or turns.

State: none stored.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any, TypedDict

from ..config.cluster import ClusterSettings
from .etcd import KeyValue, MemberStatus
from .lease import LeaseKeeper


class ClusterEntry(TypedDict):
    machine: str
    turn: str
    holder: dict[str, Any]
    since: float
    revision: int


class ClusterKeyView(TypedDict):
    key: str
    cap: int
    holders: list[ClusterEntry]
    waiting: list[ClusterEntry]  # every machine's, in cluster order
    local_waiters: list[dict[str, Any]]  # this machine's: {turn, position}


class ClusterStatus(TypedDict):
    name: str
    prefix: str
    etcd: list[str]
    connected: bool
    fenced: bool
    lease: str | None
    lease_ttl: float
    deadline_in: float | None  # seconds left to the lease deadline D, on this machine's clock
    members: list[dict[str, Any]]
    caps: dict[str, int]


def key_views(
    kvs: list[KeyValue],
    *,
    q_prefix: str,
    name: str,
    mine: Callable[[str], tuple[str, dict[str, Any]] | None],
    local_keys: Iterable[str],
    cap_of: Callable[[str], int],
) -> list[ClusterKeyView]:
    """Every cluster key with turns, from the queue keys sorted by create revision. mine(qkey):
    the turn (and holder) that has this place of ours now (see the gate's swap), if any;
    local_keys: the keys this machine has turns of (shown even with no key in etcd yet)."""
    by_key: dict[str, list[ClusterEntry]] = {}
    for kv in kvs:
        key, _, rest = kv.key[len(q_prefix) :].partition("/")
        machine, _, turn = rest.partition("/")
        try:
            value = json.loads(kv.value)
        except ValueError:
            value = {}
        ours = mine(kv.key) if machine == name else None
        if ours is not None:
            turn, value["holder"] = ours
        by_key.setdefault(key, []).append(
            {
                "machine": machine,
                "turn": turn,
                "holder": value.get("holder") or {},
                "since": value.get("since") or 0.0,
                "revision": kv.create_revision,
            }
        )
    views: list[ClusterKeyView] = []
    for key in sorted(set(by_key) | set(local_keys)):
        queue = by_key.get(key, [])
        cap = cap_of(key)
        local = []
        for position, item in enumerate(queue[cap:], start=1):
            if item["machine"] == name:
                local.append({"turn": item["turn"], "position": position})
        views.append(
            {
                "key": key,
                "cap": cap,
                "holders": queue[:cap],
                "waiting": queue[cap:],
                "local_waiters": local,
            }
        )
    return views


def status_of(
    settings: ClusterSettings,
    keeper: LeaseKeeper,
    members: list[MemberStatus],
    caps: dict[str, int],
) -> ClusterStatus:
    return {
        "name": settings.name,
        "prefix": settings.prefix,
        "etcd": list(settings.etcd),
        "connected": keeper.connected and not keeper.lost,
        "fenced": keeper.fenced,
        "lease": f"{keeper.lease:x}" if keeper.lease else None,
        "lease_ttl": keeper.lease_ttl,
        "deadline_in": keeper.deadline_in(),
        "members": [
            {"endpoint": m.endpoint, "ok": m.ok, "leader": m.leader, "error": m.error}
            for m in members
        ],
        "caps": caps,
    }
