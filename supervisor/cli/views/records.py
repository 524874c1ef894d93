"""How `ccsup history` and `ccsup show` print turn records (supervisor.history.db). Pure."""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable

from ...history import db as history
from ...wire.requester import describe
from .formats import fit, format_age, format_command, format_table

USAGE_COLUMNS = (  # the exited event's usage figures shown as columns, when any turn has them
    ("cpu_user_s", "CPU USER", lambda v: f"{v:.2f}s"),
    ("cpu_system_s", "CPU SYS", lambda v: f"{v:.2f}s"),
    ("peak_rss_bytes", "PEAK RSS", lambda v: _size(v)),
    ("peak_mem", "PEAK MEM", lambda v: _size(v)),  # the whole tree's (guardd.treemem)
    ("processes", "PROCS", lambda v: str(v)),
)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return str(n)


def when(ts: float | None) -> str:
    return "-" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}s" if value < 60 else format_age(value)


def outcome_text(record: history.TurnRecord) -> str:
    outcome = record["outcome"] or record["state"]
    if outcome == "exit":
        return f"exit {record['exit_code']}"
    if outcome == "signal":
        return f"signal {record['signal']}"
    return outcome


def gap_text(gap: float | None) -> str:
    """Seconds a turn ran without a supervisor, as `show` says it: "1.2 s"."""
    return "?" if gap is None else f"{gap:.1f} s"


def format_history(records: list[history.TurnRecord], width: int | None = None) -> list[str]:
    """The table; for a terminal (`width`), short ids (8 characters: every command takes a
    prefix) and times, and usage columns left out, last first, until COMMAND has room."""
    usage = [c for c in USAGE_COLUMNS if any(c[0] in r["usage"] for r in records)]
    adopted = any(r.get("adopted_at") is not None for r in records)  # a column once any was
    short = width is not None
    while True:
        lines = _history_table(records, usage, adopted, short)
        command_at = lines[0].index("COMMAND") if lines else 0
        if not short or not usage or width - command_at >= MIN_COMMAND:  # type: ignore[operator]
            return fit(lines, width)
        usage = usage[:-1]


MIN_COMMAND = 24  # characters of COMMAND a terminal's table keeps, dropping usage columns for it


def _history_table(records, usage, adopted: bool, short: bool) -> list[str]:
    member = any(r.get("member") is not None for r in records)  # a pool's turn: its member
    header = ["ID", "KEY", *(["MEMBER"] if member else []), "HOLDER", "OUTCOME", "QUEUED", "WAIT"]
    header += ["RUN", "ENDED"]
    header += [title for _, title, _ in usage]
    if adopted:
        header.append("ADOPTED")
    header.append("COMMAND")
    at = short_when if short else when
    rows = []
    for r in records:
        row = [
            r["id"][:8] if short else r["id"],
            r["key"],
            *([r.get("member") or "-"] if member else []),
            describe(r["holder"], None),
            outcome_text(r),
            at(r["queued_at"]),
            seconds(r["wait_s"]),
            seconds(r["run_s"]),
            at(r["ended_at"]),
        ]
        for name, _, fmt in usage:
            value = r["usage"].get(name)
            row.append("-" if not isinstance(value, (int, float)) else fmt(value))
        if adopted:  # the gap it ran through without a supervisor
            row.append("-" if r.get("adopted_at") is None else gap_text(r.get("adoption_gap_s")))
        row.append(format_command(r.get("argv")))
        rows.append(row)
    return format_table(header, rows)


def short_when(ts: float | None) -> str:
    """A time as a terminal's table shows it: 10:53:07 today, else 12-06 10:53."""
    if ts is None:
        return "-"
    local = time.localtime(ts)
    if time.strftime("%Y-%m-%d", local) == time.strftime("%Y-%m-%d"):
        return time.strftime("%H:%M:%S", local)
    return time.strftime("%m-%d %H:%M", local)


def format_leftover_counts(
    counts: list[history.LeftoverCount], width: int | None = None
) -> list[str]:
    """`history --leftovers`: per harness and name, how many times over how long, in how many
    turns ("opencode serve  14 times  over 3d02h")."""
    if not counts:
        return ["no turn left anything running when its command exited"]
    header = ["HARNESS", "NAME", "TIMES", "TURNS", "OVER", "FIRST", "LAST"]
    rows = [
        [
            c["harness"],
            c["name"],
            str(c["times"]),
            str(c["turns"]),
            format_age(c["last"] - c["first"]),
            when(c["first"]),
            when(c["last"]),
        ]
        for c in counts
    ]
    return fit(format_table(header, rows), width)


def format_leftovers(left: dict | None) -> list[str]:
    """`show`'s lines for what outlived the turn's command: one per process named."""
    if not left:
        return []
    names = [n for n in left.get("names") or [] if isinstance(n, dict)]
    count = left.get("count")
    lines = [f"  leftovers  {count} (ended by the guard when the command exited)"]
    for n in names:
        argv = n.get("argv")
        command = format_command(argv) if isinstance(argv, list) and argv else n.get("comm")
        ran = n.get("ran_s")
        lasted = f", ran {seconds(ran)}" if isinstance(ran, (int, float)) else ""
        lines.append(
            f"    {n.get('name')}  (pid {n.get('pid')}, group {n.get('pgid')}{lasted}): {command}"
        )
    if isinstance(count, int) and count > len(names):
        lines.append(f"    ... and {count - len(names)} more, not named")
    return lines


def _given(fields: dict) -> dict:
    return {name: value for name, value in fields.items() if value is not None}


def _adoptions(story: history.TurnStory) -> list[str]:
    """One line per adoption (a later supervisor took the running turn over): when, and the gap
    it ran through with no supervisor, from its adopted events (a record's adoption columns sum
    the gaps of all of them)."""
    return [
        f"  adopted    {when(e['ts'])} after a gap of {gap_text(_gap(e['body']))}"
        for e in story["events"]
        if e["kind"] == "adopted"
    ]


def _gap(body: dict) -> float | None:
    gap = body.get("gap_s")
    return float(gap) if isinstance(gap, (int, float)) and not isinstance(gap, bool) else None


# The exited event's usage figures as `show` names them, each with its unit.
_USAGE_LINES: dict[str, tuple[str, Callable[[float], str]]] = {
    "wall_s": ("wall", lambda v: f"{v:.3f}s"),
    "wait_s": ("waited", lambda v: f"{v:.3f}s"),
    "cpu_user_s": ("cpu user", lambda v: f"{v:.3f}s"),
    "cpu_system_s": ("cpu system", lambda v: f"{v:.3f}s"),
    "peak_rss_bytes": ("peak rss", lambda v: f"{_size(v)} (one process's)"),
    "peak_mem": ("peak mem", lambda v: f"{_size(v)} (the whole tree's)"),
    "processes": ("processes", str),
}


def _usage_line(name: str, value: object) -> tuple[str, str]:
    known = _USAGE_LINES.get(name)
    if known is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
        return known[0], known[1](value)
    return name, _value_text(value)


def _value_text(value: object) -> str:
    """A field's value as plain text, never JSON: a list as its words in brackets (each
    shell-quoted), a string as it is (quoted when it has spaces)."""
    if isinstance(value, str):
        return shlex.quote(value) if not value or any(c.isspace() for c in value) else value
    if isinstance(value, list):
        return "[" + " ".join(_value_text(v) for v in value) + "]"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value).lower() if isinstance(value, bool) else str(value)


def _plain(fields: dict, sep: str = "  ", eq: str = "=", prefix: str = "") -> str:
    """An event's (or a holder's) fields as `name=value` pairs, a mapping's as `name.sub=value`,
    None left out."""
    parts = []
    for k, v in fields.items():
        if isinstance(v, dict):
            inner = _plain(v, sep, eq, f"{prefix}{k}.")
            parts.extend([inner] if inner else [])
        elif v is not None:
            parts.append(f"{prefix}{k}{eq}{_value_text(v)}")
    return sep.join(parts)


def format_story(story: history.TurnStory) -> list[str]:
    lines = [
        f"turn {story['id']}",
        f"  key        {story['key']}",
        *([f"  member     {story['member']}"] if story.get("member") else []),
        f"  holder     {_plain(story['holder'], sep=', ', eq=' ') or '-'}",
        f"  command    {format_command(story.get('argv'))}",
        f"  cwd        {story.get('cwd') or '-'}",
        f"  state      {story['state']}",
        f"  outcome    {outcome_text(story) if story['outcome'] else '- (not ended)'}",
    ]
    if story["reason"]:
        lines.append(f"  reason     {story['reason']}")
    for name in ("queued_at", "granted_at", "started_at", "exited_at", "ended_at"):
        lines.append(f"  {name.removesuffix('_at'):<10} {when(story[name])}")
    lines.append(f"  wait       {seconds(story['wait_s'])}")
    lines.append(f"  run        {seconds(story['run_s'])}")
    lines.extend(_adoptions(story))
    if story["slot_index"] is not None:
        lines.append(f"  slot       {story.get('member') or story['key']}#{story['slot_index']}")
    if story["guard_pid"] is not None:
        lines.append(f"  guard pid  {story['guard_pid']}")
    for name, value in sorted(story["usage"].items()):
        label, shown = _usage_line(name, value)
        lines.append(f"  {label:<10} {shown}")
    lines.extend(format_leftovers(story.get("leftovers")))
    if story["log_pruned_at"] is not None:
        lines.append(f"  logs       pruned at {when(story['log_pruned_at'])}")
    lines.append("  events")
    for event in story["events"]:
        fields = {
            k: v
            for k, v in event["body"].items()
            if k not in ("v", "ts", "epoch", "seq", "turn_seq", "id", "key")
        }
        if event["kind"] == "leftovers":  # named above, in full
            fields = {"count": fields.get("count")}
        shown = _plain(fields)
        lines.append(
            f"    {when(event['ts'])}.{int(event['ts'] % 1 * 1000):03d}  {event['kind']:<9} {shown}".rstrip()
        )
    return lines
