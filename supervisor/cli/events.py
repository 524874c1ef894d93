"""`ccsup events [PREFIX] [--all] [--json]`: follow the bus until Ctrl-C.

One line an event for people (supervisor.cli.views.event_lines: local time, the topic with a short
turn id, the fields that matter); `--json` prints each event whole, `{"topic", "body"}` a line,
for scripts. The guards' own hints (`guard.<turn>.*`: unchecked, and repeated by the
supervisor's `turn.<id>.*`) are shown only with `--all`, or when PREFIX asks for them.
"""

from __future__ import annotations

import click

from .where import emit_json, where


@click.command()
@click.argument("prefix", required=False, default="")
@click.option("--all", "show_all", is_flag=True, help="Also the guards' hints (guard.*).")
@click.option("--json", "as_json", is_flag=True, help='Print {"topic","body"} JSON lines.')
@click.pass_context
def events(ctx: click.Context, prefix: str, show_all: bool, as_json: bool) -> None:
    """Follow the bus until Ctrl-C: a line an event (time, topic, fields), or --json.

    \b
    Examples:
      ccsup events turn.          every turn's events
      ccsup events key.codex.     pauses and resumes of codex
      ccsup events --json | jq -c 'select(.topic | endswith(".exited"))'"""
    from .views.event_lines import format_event

    hints = show_all or prefix.startswith("guard")

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
                if not hints and topic.startswith("guard."):
                    continue
                if as_json:
                    emit_json({"topic": topic, "body": body})
                else:
                    click.echo(format_event(topic, body))
        except KeyboardInterrupt:
            ctx.exit(130)
