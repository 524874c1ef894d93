"""`ccsup metrics`: the running supervisor's figures in the Prometheus exposition format.

Asks the supervisor (control command `metrics`) and prints the text as it came, for a look or a
textfile collector; `[metrics] listen` serves the same text over HTTP. Exit 3 when no supervisor
runs (the figures live in it). `--json` prints the same figures as one JSON list, a sample an
entry, `{"name", "labels", "value"}` (parsed with prometheus_client's own parser), for a script
that would rather not parse the text format.
"""

from __future__ import annotations

import click

from .where import emit_json, where


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the samples as a JSON list.")
@click.pass_context
def metrics(ctx: click.Context, as_json: bool) -> None:
    """Print the supervisor's metrics (Prometheus text format)."""
    with where(ctx).client() as client:
        text = client.call("metrics")["text"]
    if not as_json:
        click.echo(text, nl=False)
        return
    from prometheus_client.parser import text_string_to_metric_families

    samples = [
        {"name": s.name, "labels": dict(s.labels), "value": s.value}
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]
    emit_json(samples)
