"""Who asked for a turn, as `ps` shows it: the requester's pid and command name.

A slot's holder is the process that holds its lock (the supervisor); the requester is the process
that asked for the turn (`ccsup run`, a sidecar) and named itself in `holder.pid`. A turn without
labels (session, agent) is shown by its requester: `pid 4242 (ccsup)`. The command name is the
kernel's (`/proc/<pid>/comm`, at most 15 characters), read when `ps` asks: a requester that is gone
shows its pid alone. Knows /proc; nothing of slots or turns.
"""

from __future__ import annotations

from typing import TypedDict


class RequesterJSON(TypedDict):
    pid: int
    command: str | None


def command_name(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/comm", "rb") as f:
            return f.read().decode(errors="replace").strip() or None
    except OSError:
        return None


def requester(pid: int | None) -> RequesterJSON | None:
    if pid is None:
        return None
    return {"pid": pid, "command": command_name(pid)}


def describe(holder: dict | None, requester_json: dict | None) -> str:
    """The HOLDER column: session/agent labels, else the requester, else the holder's pid."""
    holder = holder if isinstance(holder, dict) else {}
    names = [str(holder[k]) for k in ("session", "agent") if holder.get(k)]
    if names:
        return "/".join(names)
    if isinstance(requester_json, dict) and requester_json.get("pid"):
        command = requester_json.get("command")
        return f"pid {requester_json['pid']}" + (f" ({command})" if command else "")
    return f"pid {holder['pid']}" if holder.get("pid") else "-"
