"""`ccsup mcp`: the MCP server over stdio (supervisor.agents.mcp), for a harness's MCP config;
`ccsup mcp install|uninstall claude|codex|opencode` writes that config (supervisor.agents.
mcp_install) naming our interpreter by absolute path, with this command's state directory.

Serving needs the optional extra `mcp` (the `mcp` SDK; from a clone: `pip install -e '.[mcp]'`);
without it, exits 1 saying so. The supervisor need not be running when it starts: each tool call
says so if it is not. Exit codes of install/uninstall: 0, 1 when the file cannot be written, 2
when it is not JSON/TOML or holds a `ccsup` server that ccsup did not write.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from ..errors import CcsupError
from .where import where

HARNESS = click.Choice(["claude", "codex", "opencode"])


@click.group(invoke_without_command=True)
@click.pass_context
def mcp(ctx: click.Context) -> None:
    """Serve ccsup's tools (run, wait, reserve, status, ps, why, logs, cancel) over MCP on stdio;
    or install that server into a harness's MCP configuration."""
    if ctx.invoked_subcommand is not None:
        return
    try:
        from ..agents import mcp as server
    except ImportError as e:
        raise CcsupError(
            f"unable to start the MCP server: {e.msg}; install the extra `mcp` into ccsup's "
            "environment (from a clone: pip install -e '.[mcp]')"
        ) from None
    from ..client.ride_through import RETURN_MARGIN

    w = where(ctx)
    config = w.config()
    state_dir = w.state_dir(config)
    down_wait = config.adopt_within + RETURN_MARGIN
    endpoints = config.endpoints.resolve(state_dir)
    server.serve(server.Settings(state_dir, endpoints, down_wait=down_wait))


def _target(value: str | None) -> Path | None:
    return Path(value).expanduser() if value else None


@mcp.command()
@click.argument("harness", type=HARNESS)
@click.option(
    "--settings",
    metavar="PATH",
    help="The file to write (claude: ~/.claude.json, codex: config.toml, opencode: opencode.json).",
)
@click.pass_context
def install(ctx: click.Context, harness: str, settings: str | None) -> None:
    """Write ccsup's MCP server into HARNESS's MCP configuration (absolute paths)."""
    from ..agents import mcp_install

    w = where(ctx)
    config = w.config()
    state_dir = w.state_dir(config).resolve()
    config_file = None if config.source.startswith("<") else os.path.abspath(config.source)
    path = mcp_install.install(harness, _target(settings), state_dir, config_file)
    click.echo(f"ccsup: {harness} MCP server 'ccsup' written to {path} (state {state_dir})")


@mcp.command()
@click.argument("harness", type=HARNESS)
@click.option("--settings", metavar="PATH", help="The file install wrote (as for install).")
def uninstall(harness: str, settings: str | None) -> None:
    """Remove exactly what `ccsup mcp install HARNESS` wrote."""
    from ..agents import mcp_install

    path, removed = mcp_install.uninstall(harness, _target(settings))
    click.echo(
        f"ccsup: {harness} MCP server 'ccsup' removed from {path}"
        if removed
        else f"ccsup: no ccsup MCP server in {path}"
    )
