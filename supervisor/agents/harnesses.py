"""Each harness's hook JSON: what comes in on stdin (a shell tool call) and what goes out (pass it,
rewrite its command, or refuse it with a message the model reads).

- Claude Code (PreToolUse, matcher `Bash`): in `{session_id, cwd, tool_name: "Bash",
  tool_input: {command, ...}}`; out `hookSpecificOutput` with `permissionDecision` and, for a
  rewrite, `updatedInput` (the whole tool input, its command replaced). Claude Code applies
  `updatedInput` only with "allow" (or "ask"); "allow" it is.
- Codex (PreToolUse, matcher `Bash`): the same shapes; Codex counts `updatedInput` only with
  `permissionDecision: "allow"`.
- OpenCode: ccsup's own plugin (`tool.execute.before`, written by `ccsup hook install opencode`)
  sends `{tool: "bash", sessionID, callID, args: {command, ...}, directory}` and reads back
  `{action: "pass"|"rewrite"|"refuse", command, message}`: it sets `output.args.command`, or
  throws the message (the model sees the tool fail with it).

Pass is an empty stdout and exit 0 for all three: the command runs as it was. In a session `ccsup
wrap` runs, the call's session is the wrapped session's label (`CCSUP_WRAP_SESSION`), before the
harness's own id, so that `ps` shows which wrapped session its turns belong to. Pure: no I/O.
"""

from __future__ import annotations

import json
import os

TYPE_CHECKING = False  # typing itself costs the hook a few ms on every shell command
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

HARNESSES = ("claude", "codex", "opencode")
WRAP_SESSION_ENV = "CCSUP_WRAP_SESSION"  # set by `ccsup wrap`: the wrapped session's label


class Call:
    """One shell tool call: its command, cwd, session and the tool input as it came (a rewrite
    replaces only its command)."""

    __slots__ = ("command", "cwd", "session", "tool_input")

    def __init__(
        self, command: str, cwd: str | None, session: str | None, tool_input: dict[str, Any]
    ):
        self.command = command
        self.cwd = cwd
        self.session = session
        self.tool_input = tool_input


class BadPayload(ValueError):
    """A payload that is not a shell tool call this hook understands (it passes untouched)."""


def parse(harness: str, payload: Any, env: Mapping[str, str] = os.environ) -> Call | None:
    """The shell call in a payload; None for another tool (not ours to look at)."""
    if not isinstance(payload, dict):
        raise BadPayload(f"the payload is a JSON {type(payload).__name__}, not an object")
    if harness == "opencode":
        tool, tool_input = payload.get("tool"), payload.get("args")
        session, cwd = payload.get("sessionID"), payload.get("directory")
        if tool != "bash":
            return None
    else:
        tool, tool_input = payload.get("tool_name"), payload.get("tool_input")
        session, cwd = payload.get("session_id"), payload.get("cwd")
        if tool not in ("Bash", "shell", "local_shell", "exec_command"):
            return None
    if not isinstance(tool_input, dict):
        raise BadPayload(f"the {tool} call has no tool input object")
    command = tool_input.get("command")
    if isinstance(command, list) and all(isinstance(w, str) for w in command):
        import shlex

        command = shlex.join(command)
        tool_input = {**tool_input, "command": command}
    if not isinstance(command, str):
        raise BadPayload(f"the {tool} call's command is not a string")
    if harness == "opencode" and isinstance(tool_input.get("workdir"), str):
        cwd = tool_input["workdir"]
    return Call(
        command,
        cwd if isinstance(cwd, str) else None,
        env.get(WRAP_SESSION_ENV) or (session if isinstance(session, str) else None),
        tool_input,
    )


def rewrite(harness: str, call: Call, command: str, reason: str, decision: str = "allow") -> str:
    """Replace the call's command; `decision` "allow" (approved without the harness asking: only
    for one plain simple command) or "ask" (Claude Code: its own prompt judges the new line)."""
    if harness == "opencode":
        return json.dumps({"action": "rewrite", "command": command}, ensure_ascii=False)
    out = {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": decision,
            "permissionDecisionReason": reason,
            "updatedInput": {**call.tool_input, "command": command},
        }
    }
    return json.dumps(out, ensure_ascii=False)


def allow(harness: str) -> str | None:
    """Let the call run as it is, without the harness asking for permission."""
    if harness != "claude":
        return None  # OpenCode asks nothing of a plugin; Codex takes no "allow" without a rewrite
    out = {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "allow",
            "permissionDecisionReason": "ccsup: waits for a queued turn",
        }
    }
    return json.dumps(out)


def refuse(harness: str, message: str) -> str:
    if harness == "opencode":
        return json.dumps({"action": "refuse", "message": message}, ensure_ascii=False)
    out = {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "deny",
            "permissionDecisionReason": message,
        }
    }
    return json.dumps(out, ensure_ascii=False)
