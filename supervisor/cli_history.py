"""`ccsup history` and `ccsup show ID`: finished turns, and one turn's whole record.

Both read the history file (supervisor.history) directly, read-only, so they work whether or not
a supervisor runs on the state directory (the history survives it). `show` knows running turns
too: the supervisor records each lifecycle event as it publishes it. Exit codes: 0, 1 when the
history cannot be read or does not know the turn, 2 for bad options.
"""

from __future__ import annotations

import json
import time

import click

from . import history
from .errors import CcsupError, UsageError

USAGE_COLUMNS = (  # the exited event's usage figures shown as columns, when any turn has them
    ("cpu_user_s", "CPU USER", lambda v: f"{v:.2f}s"),
    ("cpu_system_s", "CPU SYS", lambda v: f"{v:.2f}s"),
    ("peak_rss_bytes", "PEAK RSS", lambda v: _size(v)),
    ("processes", "PROCS", lambda v: str(v)),
)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return str(n)


def _when(ts: float | None) -> str:
    return "-" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _seconds(value: float | None) -> str:
    from .cli import format_age

    if value is None:
        return "-"
    return f"{value:.2f}s" if value < 60 else format_age(value)


def _since_option(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    from .config import parse_duration

    try:
        return time.time() - parse_duration(value, where="--since")
    except CcsupError as e:
        raise click.BadParameter(e.message.removeprefix("--since: ")) from None


def _outcome_option(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]):
    wanted = [o for value in values for o in value.split(",") if o]
    unknown = sorted(set(wanted) - set(history.OUTCOMES))
    if unknown:
        raise click.BadParameter(f"{unknown[0]!r}; known: {', '.join(history.OUTCOMES)}")
    return wanted or None


def _outcome(record: history.TurnRecord) -> str:
    outcome = record["outcome"] or record["state"]
    if outcome == "exit":
        return f"exit {record['exit_code']}"
    if outcome == "signal":
        return f"signal {record['signal']}"
    return outcome


def format_history(records: list[history.TurnRecord]) -> list[str]:
    from .cli import format_holder, format_table

    usage = [c for c in USAGE_COLUMNS if any(c[0] in r["usage"] for r in records)]
    header = ["ID", "KEY", "HOLDER", "OUTCOME", "QUEUED", "WAIT", "RUN", "ENDED"]
    header += [title for _, title, _ in usage]
    rows = []
    for r in records:
        row = [
            r["id"],
            r["key"],
            format_holder(r["holder"]),
            _outcome(r),
            _when(r["queued_at"]),
            _seconds(r["wait_s"]),
            _seconds(r["run_s"]),
            _when(r["ended_at"]),
        ]
        for name, _, fmt in usage:
            value = r["usage"].get(name)
            row.append("-" if not isinstance(value, (int, float)) else fmt(value))
        rows.append(row)
    return format_table(header, rows)


@click.command("history")
@click.option("--key", help="Only turns of this cap key.")
@click.option(
    "--since",
    callback=_since_option,
    metavar="DURATION",
    help='Only turns that ended within this long ("1h", "30m").',
)
@click.option(
    "--outcome",
    "outcomes",
    multiple=True,
    callback=_outcome_option,
    help=f"Only these outcomes (repeat or comma-separate): {', '.join(history.OUTCOMES)}.",
)
@click.option("--limit", type=click.IntRange(1, 1_000_000), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of turn records.")
@click.pass_context
def history_command(ctx, key, since, outcomes, limit, as_json) -> None:
    """Finished turns, newest first: id, key, holder, outcome, times, what they used."""
    state_dir = ctx.obj.state_dir()
    try:
        records = history.query(state_dir, key=key, since=since, outcomes=outcomes, limit=limit)
    except history.HistoryError as e:
        raise CcsupError(e.message) from None
    if as_json:
        click.echo(json.dumps(records, ensure_ascii=False))
        return
    for line in format_history(records):
        click.echo(line)


def format_story(story: history.TurnStory) -> list[str]:
    lines = [
        f"turn {story['id']}",
        f"  key        {story['key']}",
        f"  holder     {json.dumps(story['holder'], ensure_ascii=False)}",
        f"  state      {story['state']}",
        f"  outcome    {_outcome(story) if story['outcome'] else '- (not ended)'}",
    ]
    if story["reason"]:
        lines.append(f"  reason     {story['reason']}")
    for name in ("queued_at", "granted_at", "started_at", "exited_at", "ended_at"):
        lines.append(f"  {name.removesuffix('_at'):<10} {_when(story[name])}")
    lines.append(f"  wait       {_seconds(story['wait_s'])}")
    lines.append(f"  run        {_seconds(story['run_s'])}")
    if story["slot_index"] is not None:
        lines.append(f"  slot       {story['key']}#{story['slot_index']}")
    if story["guard_pid"] is not None:
        lines.append(f"  guard pid  {story['guard_pid']}")
    for name, value in sorted(story["usage"].items()):
        lines.append(f"  {name:<10} {value}")
    if story["log_pruned_at"] is not None:
        lines.append(f"  logs       pruned at {_when(story['log_pruned_at'])}")
    lines.append("  events")
    for event in story["events"]:
        fields = {
            k: v
            for k, v in event["body"].items()
            if k not in ("v", "ts", "seq", "turn_seq", "id", "key")
        }
        shown = json.dumps(fields, ensure_ascii=False) if fields else ""
        lines.append(
            f"    {_when(event['ts'])}.{int(event['ts'] % 1 * 1000):03d}  {event['kind']:<9} {shown}".rstrip()
        )
    return lines


@click.command("show")
@click.argument("turn_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print the record (with its events) as JSON.")
@click.pass_context
def show_command(ctx, turn_id: str, as_json: bool) -> None:
    """One turn's whole record, running or finished: outcome, times, usage, every event."""
    from .paths import TURN_ID

    if not TURN_ID.match(turn_id):
        raise UsageError(f"{turn_id!r} is not a turn id (1 to 128 letters, digits, '_' or '-')")
    state_dir = ctx.obj.state_dir()
    try:
        story = history.show(state_dir, turn_id)
    except history.HistoryError as e:
        raise CcsupError(e.message) from None
    if story is None:
        raise CcsupError(
            f"no turn {turn_id} in the history of {state_dir} (never run here, or older than "
            "[logs] keep)"
        )
    if as_json:
        click.echo(json.dumps(story, ensure_ascii=False))
        return
    for line in format_story(story):
        click.echo(line)
