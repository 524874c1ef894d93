"""`ccsup status`: whether the supervisor runs, and what it does."""

from __future__ import annotations

import time

import click

from .formats import age
from .where import emit_json, where


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Whether the supervisor runs, and what it does."""
    with where(ctx).client() as client:
        result = client.status()
    if as_json:
        emit_json(result)
        return

    started = result.get("started_at")
    click.echo(
        f"ccsup {result.get('version', '?')}, pid {result.get('pid', '?')}, up {age(started, time.time())}"
    )
    click.echo(f"state   {result.get('state_dir', client.state_dir)}")
    if "config" in result:
        click.echo(f"config  {result['config']}")
    click.echo(f"turns   {result['turns']} active, {result['waits']} waiting")
    if "containment" in result:  # cgroup v2 per turn, or the subreaper and process groups
        where_ = result.get("cgroup") or result.get("cgroup_why_not") or ""
        click.echo(f"contain {result['containment']}" + (f" ({where_})" if where_ else ""))
    for key, entry in sorted((result.get("limits") or {}).items()):
        for name, why in sorted(entry.get("not_enforced", {}).items()):
            click.echo(f"limits  {key}.{name}: not enforced: {why}")
    from .keys import format_in_force, format_keys

    for line in format_in_force(result):  # caps and where each comes from, rates, max_pause
        click.echo(line)
    for line in format_keys(result):  # paused keys and rate windows
        click.echo(f"keys    {line}")
    if "cluster" in result:  # [cluster]: health, this machine's lease and its deadline
        from .cluster_formats import format_cluster_status

        for line in format_cluster_status(result["cluster"]):
            click.echo(line)
