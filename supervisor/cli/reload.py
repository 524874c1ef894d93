"""`ccsup reload`: re-read the configuration (caps, rates, graces, limits; endpoints need a
restart) and print what changed, one setting a line (`slots.caps.codex: 2 -> 3`), or that
nothing did. The supervisor computes the diff (supervisor.daemon.in_force) and also puts it in
`supervisor.reloaded`; `--json` prints its answer, `{"config", "changed": [{"name", "old",
"new"}]}`. A broken config changes nothing and exits 2."""

from __future__ import annotations

import click

from .where import emit_json, where


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the supervisor's answer as JSON.")
@click.pass_context
def reload(ctx: click.Context, as_json: bool) -> None:
    """Re-read the configuration and print what changed (endpoints need a restart)."""
    with where(ctx).client() as client:
        result = client.reload()
    if as_json:
        emit_json(result)
        return
    changed = result.get("changed")
    source = result.get("config", "config")
    if changed is None:  # a supervisor older than the diff
        click.echo(f"reloaded ({source})")
        return
    if not changed:
        click.echo(f"reloaded {source}: nothing changed")
        return
    click.echo(f"reloaded {source}: {len(changed)} change{'s' if len(changed) > 1 else ''}")
    for change in changed:
        old = "(not set)" if change["old"] is None else change["old"]
        new = "(not set)" if change["new"] is None else change["new"]
        click.echo(f"  {change['name']}: {old} -> {new}")
