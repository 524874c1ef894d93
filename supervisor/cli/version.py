"""`ccsup version` (also `ccsup -V` and `--version`): this ccsup's version and, when a supervisor
runs on the state directory, the version that supervisor runs (after an upgrade, the two differ
until `ccsup restart`). Exit 0 whether or not one runs.
"""

from __future__ import annotations

import click

from .. import __version__
from ..errors import CcsupError
from .where import emit_json, where


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the versions as JSON.")
@click.pass_context
def version(ctx: click.Context, as_json: bool) -> None:
    """This ccsup's version, and the running supervisor's."""
    running = None
    try:
        with where(ctx).client() as client:
            if client.running():
                status = client.status()
                running = {"version": status.get("version"), "pid": status.get("pid")}
    except CcsupError:
        running = None  # none answers: only our own version to say
    if as_json:
        emit_json({"version": __version__, "supervisor": running})
        return
    click.echo(f"ccsup {__version__}")
    if running is not None:
        click.echo(f"supervisor {running['version']} (pid {running['pid']})")
