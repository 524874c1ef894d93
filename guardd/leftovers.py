"""A turn's leftovers: what of its tree still ran when its command exited, named before it is ended.

Design note. The guard knows the turn's tree from its last scan (guardd.scan); when CMD has been
reaped, every descendant still running (not a zombie) outlived the command: an MCP server a
session never stopped, a background shell, a daemon that double-forked away. Each is named by its
`comm`, the first three of its argv, pid, group and how long it had run, read from /proc before
the guard signals anything (a process ended first would have no argv left to read). At most
`LIMIT` are named, the oldest first (the first processes of the turn: usually the ones it meant
to start, not their short-lived children); `count` is all of them.

`name` is what a person would call the process and what the history sums by: the basename of
argv[0] and its first argument that is not an option and holds no space (a script's text is no
name; a path is cut to its basename), at most MAX_NAME characters, such as
`opencode serve`, `node index.js` or `python3 mcp_server_git`; `comm` alone when argv is gone.

A process that ended or whose pid was taken again between the scan and the read is counted but
not named. Stateless; the guard writes what `collect` returns into its record (`leftovers`).
Standard library only.
"""

from __future__ import annotations

import os

from guardd import procs

LIMIT = 100
MAX_NAME = 120  # characters of a name (an argv[0] may be anything)


def name_of(comm: str, argv: list[str]) -> str:
    """`opencode serve` for argv ["/usr/bin/opencode", "serve", "--port"]; comm without argv."""
    if not argv:
        return comm
    words = [os.path.basename(argv[0]) or argv[0]]
    for arg in argv[1:]:
        if arg and not arg.startswith("-") and not any(c.isspace() for c in arg):
            words.append(os.path.basename(arg.rstrip("/")) or arg)
            break
    return " ".join(words)[:MAX_NAME]


def collect(descendants: dict[int, procs.Stat], limit: int = LIMIT) -> dict | None:
    """`{"count", "names"}` of the live processes among `descendants` (a scan's), or None when
    there are none. Each name: `name`, `comm`, `argv` (its first three), `pid`, `pgid`,
    `ran_s`."""
    live = sorted((s for s in descendants.values() if not s.zombie), key=lambda s: (s.start, s.pid))
    if not live:
        return None
    try:
        now = procs.uptime()
    except (OSError, ValueError, IndexError):
        now = None
    tick = os.sysconf("SC_CLK_TCK")
    names = []
    for stat in live[:limit]:
        command = procs.command_of(stat.pid)
        if command is None or procs.start_ticks(stat.pid) != stat.start:
            continue  # gone (or its pid another's) since the scan: counted, not named
        comm, argv = command
        ran = None if now is None else round(max(0.0, now - stat.start / tick), 3)
        names.append(
            {
                "name": name_of(comm, argv),
                "comm": comm,
                "argv": argv,
                "pid": stat.pid,
                "pgid": stat.pgid,
                "ran_s": ran,
            }
        )
    return {"count": len(live), "names": names}
