"""`ccsup status`: whether the supervisor runs, and what it does.

No supervisor running: exit 3, and while guards of the state directory keep turns running for a
supervisor to adopt (`[guard] adopt_within`), the message counts them and says until when the last
waits: a user then knows that `ccsup start` saves them (supervisor.guards.waiting reads the guard
records; nothing is changed).
"""

from __future__ import annotations

import time

import click

from ..errors import NotRunning
from .views.formats import age
from .where import emit_json, where


def clock(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts))


def waiting_text(count: int, until: float | None) -> str:
    """ "3 turns wait for adoption (the last until 12:00:30)"."""
    if count == 1:
        return "1 turn waits for adoption" + (f" (until {clock(until)})" if until else "")
    return f"{count} turns wait for adoption" + (
        f" (the last until {clock(until)})" if until else ""
    )


def _not_running(ctx: click.Context, e: NotRunning) -> NotRunning:
    """The NotRunning to raise: with the turns that wait for adoption, when any do."""
    from ..guards import waiting
    from ..paths import StatePaths

    state_dir = where(ctx).state_dir()
    found = waiting.survey(StatePaths(state_dir).guards)
    if not found.count:
        return e
    from ..config.last_start import start_command

    them = "it" if found.count == 1 else "them"
    return NotRunning(
        f"no supervisor is running on {state_dir}; {waiting_text(found.count, found.last_until)}"
        f"; start a supervisor to adopt {them}: {start_command(state_dir)}"
    )


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Whether the supervisor runs, and what it does."""
    try:
        with where(ctx).client() as client:
            result = client.status()
    except NotRunning as e:
        raise _not_running(ctx, e) from None
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
    adopted = result.get("adopted")  # running turns it took over at its start
    took = f" ({adopted} adopted at its start)" if adopted else ""
    click.echo(f"turns   {result['turns']} active, {result['waits']} waiting{took}")
    if result.get("waiting_adoption"):  # guards whose turns this supervisor has not adopted yet
        until = result.get("waiting_adoption_until")
        click.echo(f"adopt   {waiting_text(result['waiting_adoption'], until)}")
    if "containment" in result:  # cgroup v2 per turn, or the subreaper and process groups
        where_ = result.get("cgroup") or result.get("cgroup_why_not") or ""
        click.echo(f"contain {result['containment']}" + (f" ({where_})" if where_ else ""))
    for key, entry in sorted((result.get("limits") or {}).items()):
        for name, why in sorted(entry.get("not_enforced", {}).items()):
            click.echo(f"limits  {key}.{name}: not enforced: {why}")
    for line in format_memory(result.get("memory")):  # [memory]: budget, prediction, pressure
        click.echo(f"memory  {line}")
    from .views.keys import format_in_force, format_keys

    for line in format_in_force(result):  # caps and where each comes from, rates, max_pause
        click.echo(line)
    for line in format_keys(result):  # paused keys and rate windows
        click.echo(f"keys    {line}")
    if "cluster" in result:  # [cluster]: health, this machine's lease and its deadline
        from .views.cluster import format_cluster_status

        for line in format_cluster_status(result["cluster"]):
            click.echo(line)


def format_memory(memory: dict | None) -> list[str]:
    """`status`'s memory lines: the budget and room, the running turns' predicted use, the
    pressure, the keys' predictions, and which parts are off on this machine."""
    if not memory:
        return []
    from .views.formats import format_size

    lines = []
    budget = memory.get("budget")
    predicted = f"running turns predicted {format_size(memory.get('predicted'))}"
    if budget is None:
        lines.append(f"no budget (turns are admitted by their caps); {predicted}")
    else:
        named = "auto" if budget == "auto" else format_size(budget)
        room = format_size(memory.get("room")) if memory.get("room") is not None else "?"
        lines.append(f"budget {named}: {predicted}, room {room}")
    if memory.get("psi") and memory.get("pressure"):
        avg10 = memory.get("avg10")
        now = "?" if avg10 is None else f"{avg10 * 100:.2f}%"
        state = "ON: nothing is granted" if memory.get("pressured") else "off"
        lines.append(f"pressure {now} (brake at {memory['pressure'] * 100:g}%): {state}")
    keys = memory.get("keys") or {}
    if keys:
        shown = ", ".join(
            f"{key} {format_size(k['prediction'])} ({k['source']})" for key, k in keys.items()
        )
        lines.append(f"predicted {shown}; other keys by their caps alone")
    elif budget is not None:
        lines.append("no key has a prediction yet: every key is admitted by its caps alone")
    if memory.get("alone"):
        lines.append(f"turn {memory['alone']} runs alone: its prediction is above the budget")
    lines += [f"off: {why}" for why in memory.get("off") or []]
    return lines
