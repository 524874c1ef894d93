"""Agents use ccsup themselves: an MCP server (`ccsup mcp`) and a shell-command hook (`ccsup hook`)
for Claude Code, Codex and OpenCode.

Design note. An agent's harness runs heavy commands (test suites, builds, `docker compose up`)
straight from its shell tool, one session beside the other, and each harness's own caps hold only
per session. Two ways in, both clients of the supervisor like the CLI:

- `mcp` (`ccsup mcp`): an MCP server over stdio on the official `mcp` SDK (the optional extra
  `ccsup[mcp]`). Its tools queue a command as a turn and answer within a bound (25 s) whatever
  happens, because an MCP call without a progress token times out at 60 s in the harnesses (and
  OpenCode never sends one): a command still waiting or running answers with its id, and `wait`
  resumes by id, never running anything twice.
- `hook` (`ccsup hook run <harness>`, installed by `ccsup hook install`): the harness asks it
  before every shell command; a command that matches a rule (`rules`) is rewritten to run as a
  ccsup turn (`ccsup run --reservation R --pass-env ... -- sh -c '<original>'`), in the agent's
  cwd and environment, its output and status passed through. Each harness's hook JSON, in and
  out, is in `harnesses`; the settings file each one reads is written by `install`.
- `turns`: what both share: follow one turn by id within a bound (the history file for what
  already happened, a live bus subscription for what comes), and a turn's log tail.

Rejected: a blocking MCP tool that holds the call until the turn ends (the call times out exactly
when the machine is busy), and a hook that waits for a slot before answering (a harness kills a
hook that runs past its own timeout, and a killed hook lets the command run unqueued).

Imports client, wire, config, history (read-only) and the ground floor; never the daemon. The
hook's path for a command that matches nothing imports only the standard library and
`rules`/`harnesses` (no click, no zmq): it runs before every shell command.
"""
