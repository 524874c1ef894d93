"""How `ccsup ps` and `ccsup status` print the cluster (`[cluster]`, supervisor.cluster.gate): the
holders of each cluster key on every machine, this machine's waiters with their cluster position;
the members' health, this machine's lease and its deadline. Pure formatting."""

from __future__ import annotations

from typing import Any

from ...wire.requester import describe
from .formats import age, format_table

SHOWN = 10  # this machine's waiters named on the line of a key


def format_cluster_ps(views: Any, now: float) -> list[str]:
    """`ps` result's "cluster": a list of keys, or {"error"} when etcd could not be read."""
    if isinstance(views, dict):
        return ["", f"cluster: unable to read the cluster queue: {views.get('error')}"]
    lines: list[str] = []
    for view in views:
        holders = view.get("holders", [])
        lines += ["", f"cluster key {view.get('key')}: cap {view.get('cap')} across machines"]
        if holders:
            rows = [
                [h.get("machine", "?"), h.get("turn", "?"), describe(h.get("holder"), None),
                 age(h.get("since"), now)]
                for h in holders
            ]  # fmt: skip
            lines += format_table(["MACHINE", "TURN", "HOLDER", "SINCE"], rows)
        else:
            lines.append("no turn holds it")
        waiting = view.get("waiting", [])
        local = view.get("local_waiters", [])
        mine = ", ".join(f"{w.get('turn')} (position {w.get('position')})" for w in local[:SHOWN])
        if len(local) > SHOWN:
            mine += f" and {len(local) - SHOWN} more (ps --json lists them)"
        lines.append(
            f"{len(waiting)} waiting across machines"
            + (f"; here: {mine}" if mine else "; none of them here")
        )
    return lines


def format_cluster_status(status: dict[str, Any]) -> list[str]:
    """`status` result's "cluster"."""
    name = status.get("name", "?")
    if "error" in status:
        return [f"cluster {name}: {status['error']}"]
    if status.get("fenced"):
        state = "FENCED (no renewal: cluster turns stopped, nothing granted)"
    elif status.get("connected"):
        state = "connected"
    else:
        state = "NOT CONNECTED"
    lease = status.get("lease")
    left = status.get("deadline_in")
    deadline = f", deadline in {left:.1f}s" if isinstance(left, (int, float)) else ""
    lines = [
        f"cluster {name} under {status.get('prefix')}: {state}"
        + (f", lease {lease} (ttl {status.get('lease_ttl')}s){deadline}" if lease else ", no lease")
    ]
    members = status.get("members", [])
    healthy = sum(1 for m in members if m.get("ok"))
    parts = []
    for m in members:
        what = "leader" if m.get("leader") else "ok" if m.get("ok") else m.get("error") or "down"
        parts.append(f"{m.get('endpoint')} {what}")
    lines.append(f"etcd    {healthy}/{len(members)} healthy: " + "; ".join(parts))
    caps = status.get("caps") or {}
    if caps:
        lines.append("caps    " + ", ".join(f"{k}={v}" for k, v in caps.items()) + " (cluster)")
    return lines
