"""`ccsup events`: follow the bus: print `topic body` lines until Ctrl-C."""

from __future__ import annotations

import click

from .where import emit_json, where


@click.command()
@click.argument("prefix", required=False, default="")
@click.option("--json", "as_json", is_flag=True, help='Print {"topic","body"} JSON lines.')
@click.pass_context
def events(ctx: click.Context, prefix: str, as_json: bool) -> None:
    """Follow the bus: print `topic body` lines until Ctrl-C."""

    def gap(first: int, got: int) -> None:
        click.echo(f"ccsup: missed {got - first} event(s) (seq {first} to {got - 1})", err=True)

    with where(ctx).client() as client, client.subscribe([prefix], on_gap=gap) as sub:
        try:
            while True:
                event = sub.recv(1.0)
                if event is None:
                    client.check_running()
                    continue
                topic, body = event
                if as_json:
                    emit_json({"topic": topic, "body": body})
                else:
                    import json

                    click.echo(f"{topic} {json.dumps(body, ensure_ascii=False)}")
        except KeyboardInterrupt:
            ctx.exit(130)
