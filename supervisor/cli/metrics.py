"""`ccsup metrics`: the running supervisor's figures in the Prometheus exposition format.

Asks the supervisor (control command `metrics`) and prints the text as it came, for a look or a
textfile collector; `[metrics] listen` serves the same text over HTTP. Exit 3 when no supervisor
runs (the figures live in it).
"""

from __future__ import annotations

import click

from .where import where


@click.command()
@click.pass_context
def metrics(ctx: click.Context) -> None:
    """Print the supervisor's metrics (Prometheus text format)."""
    with where(ctx).client() as client:
        click.echo(client.call("metrics")["text"], nl=False)
