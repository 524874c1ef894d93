"""What `--help` shows beyond each command's own text: the groups of `ccsup --help`, and an
example for every command whose help has none (appended as its epilog when the command is
loaded). Pure data; a command added to COMMANDS without a group is listed under "Other", and
tests/cli/test_help.py fails until it has an example."""

from __future__ import annotations

# `ccsup --help` lists the commands in these groups, in this order.
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Run work", ("run", "wait", "cancel")),
    ("Watch", ("ps", "top", "status", "logs", "events", "history", "show", "metrics", "web")),
    ("Admission", ("pause", "resume", "quota")),
    ("The supervisor", ("start", "stop", "restart", "reload", "reap", "config", "version")),
    ("Agents", ("mcp", "hook", "wrap")),
)

# Shown as "Examples:" under a command's help, unless its own text has some.
EXAMPLES: dict[str, tuple[str, ...]] = {
    "start": ("ccsup start --caps codex=2,opencode:xai=1", "ccsup start --foreground  # systemd"),
    "status": ("ccsup status", "ccsup status --json | jq .caps_in_force"),
    "run": (
        "ccsup run --key codex -- codex exec 'fix the tests'",
        "ccsup run --key t --wait-timeout 30s --timeout 10m -- make check",
    ),
    "wait": ("ccsup wait 3f2a",),
    "cancel": ("ccsup cancel 3f2a9c01",),
    "reap": ("ccsup reap", "ccsup reap --key codex"),
    "reload": ("ccsup reload", "kill -HUP $(ccsup status --json | jq .pid)  # the same"),
    "config": (
        "ccsup config init                  write ~/.config/ccsup/ccsup.toml (folders made)",
        "ccsup config init --path - | less  print it instead",
        "ccsup config check",
    ),
    "web": (
        "ccsup web                          serve the page on http://127.0.0.1:8765",
        "ccsup web --listen 127.0.0.1:0     on a port the system chooses (printed)",
    ),
    "history": ("ccsup history --key codex --since 1h", "ccsup history --outcome exit --json"),
    "show": ("ccsup show 3f2a9c01", "ccsup show 3f2a9c01 --json | jq .events"),
    "metrics": ("ccsup metrics | grep ccsup_turns", "ccsup metrics --json"),
    "version": ("ccsup version", "ccsup -V"),
    "pause": (
        "ccsup pause codex --for 15m --reason 'rate limited'",
        "ccsup pause opencode --until 2026-12-02T18:00",
    ),
    "resume": ("ccsup resume codex",),
    "quota": (
        "ccsup quota codex",
        "ccsup quota set codex --window 5h --used 97% --resets-at 15:00",
        "ccsup quota clear codex",
    ),
    "restart": ("ccsup restart --timeout 30s",),
    "mcp": ("ccsup mcp  # as an MCP server command in the agent's config",),
    "hook": ("ccsup hook install claude", "ccsup hook doctor codex"),
}


def examples_epilog(name: str, help_text: str | None) -> str | None:
    """The epilog to add to command `name` (None when its help shows examples already)."""
    if "Example" in (help_text or "") or name not in EXAMPLES:
        return None
    lines = "\n".join(f"  {line}" for line in EXAMPLES[name])
    return f"\b\nExamples:\n{lines}"
