"""`ccsup mcp`: the MCP server over stdio (supervisor.agents.mcp), for a harness's MCP config.

Needs the optional extra `ccsup[mcp]` (the `mcp` SDK); without it, exits 1 saying how to install
it. The supervisor need not be running when it starts: each tool call says so if it is not.
"""

from __future__ import annotations

import click

from ..errors import CcsupError
from .where import where


@click.command()
@click.pass_context
def mcp(ctx: click.Context) -> None:
    """Serve ccsup's tools (run, wait, reserve, status, ps, why, logs, cancel) over MCP on stdio."""
    try:
        from ..agents import mcp as server
    except ImportError as e:
        raise CcsupError(
            f"unable to start the MCP server: {e.msg}; install it with: pip install 'ccsup[mcp]'"
        ) from None
    w = where(ctx)
    config = w.config()
    state_dir = w.state_dir(config)
    server.serve(server.Settings(state_dir, config.endpoints.resolve(state_dir)))
