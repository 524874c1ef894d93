"""What `ccsup top` shows, as lines that fit a terminal: keys, holders, the queue, the last turns.
Pure: built from `status`, `ps`, the history's last turns and CPU/memory samples; no curses.

Each line is `(text, style)`, the text cut to the width; style is one of STYLES, which the
terminal side turns into colour (or, with NO_COLOR, plain bold/reverse). The selectable rows
(holders, then waiters) are `Row`s, in screen order, so the cursor moves over what is shown.
The screen's budget: a header line, the keys (at most a quarter of the screen), the holders and
the queue (what is left, shared), the last turns (at most 5), a message line and the key help.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import NamedTuple

from .formats import format_age, format_command

STYLES = ("plain", "title", "header", "held", "waiting", "paused", "failed", "selected", "dim")
HELP = "c cancel  p pause  r resume  l log  up/down select  q quit"


class Row(NamedTuple):
    turn: str
    key: str


class Line(NamedTuple):
    text: str
    style: str
    row: Row | None = None  # a selectable line


@dataclass
class Usage:
    cpu_percent: float | None  # of one core, since the previous sample
    rss_bytes: int


@dataclass
class Model:
    status: dict = field(default_factory=dict)
    ps: dict = field(default_factory=dict)
    recent: list[dict] = field(default_factory=list)  # history records, newest first
    usage: dict[str, Usage] = field(default_factory=dict)
    problem: str | None = None  # the supervisor cannot be reached, say


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "K", "M", "G"):
        if n < 1024 or unit == "G":
            return f"{n:.0f}{unit}" if unit in ("B", "K") else f"{n:.1f}{unit}"
        n //= 1024
    return str(n)


WIDE = 100  # columns from which the holders and the queue show a HOLDER column
HOLDER_WIDTH = 18


def _holder_cell(entry: dict) -> str:
    """A HOLDER cell: the holder's session/agent, else the requester's pid (as `ps` says it)."""
    from ...wire.requester import describe

    return f"{_cut(describe(entry.get('holder'), entry.get('requester')), HOLDER_WIDTH - 2):<{HOLDER_WIDTH}}"


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "~"


def why_word(why: dict | None) -> str:
    """The one-word reason a waiter waits (ps's `why.reason`), '-' when granted now."""
    return str((why or {}).get("reason") or "-")


def key_rows(model: Model) -> list[tuple[str, str, int, int, str, str]]:
    """(key, cap, held, waiting, paused, rate) for each key worth a line: configured or busy."""
    caps = {e["key"]: e["cap"] for e in model.status.get("caps_in_force") or []}
    held: dict[str, int] = {}
    for slot in model.ps.get("slots", []):
        if slot.get("key", "_").startswith("_"):
            continue
        caps.setdefault(slot["key"], slot.get("cap", "?"))
        if slot.get("state") not in ("free", None):
            held[slot["key"]] = held.get(slot["key"], 0) + 1
    waiting: dict[str, int] = {}
    for wait in model.ps.get("waits", []):
        waiting[wait["key"]] = waiting.get(wait["key"], 0) + 1
        caps.setdefault(wait["key"], "?")
    paused, rate = {}, {}
    for entry in model.ps.get("keys") or []:
        if "cap" in entry:  # a paused key that has not run yet: its cap as ps says it
            caps.setdefault(entry["key"], entry["cap"])
            if caps[entry["key"]] == "?":
                caps[entry["key"]] = entry["cap"]
        if entry.get("paused"):
            until = entry["paused"].get("until")
            paused[entry["key"]] = "until " + time.strftime("%H:%M:%S", time.localtime(until))
        if entry.get("next_grant"):
            rate[entry["key"]] = "held"
        windows = entry.get("quota") or []
        if windows and not entry.get("paused"):  # the fullest window, in the PAUSED column
            w = max(windows, key=lambda w: w["used"])
            until = time.strftime("%H:%M:%S", time.localtime(w["resets_at"]))
            paused[entry["key"]] = f"{w['window']} {w['used'] * 100:.0f}% {until}"
    rows = []
    for key in sorted(caps, key=lambda k: (-(held.get(k, 0) + waiting.get(k, 0)), k)):
        rows.append(
            (
                key,
                str(caps[key]),
                held.get(key, 0),
                waiting.get(key, 0),
                paused.get(key, "-"),
                rate.get(key, "-"),
            )
        )
    return rows


def render(model: Model, now: float, width: int, height: int, message: str = "") -> list[Line]:
    """The whole screen, `height` lines at most, each cut to `width`."""
    width = max(width, 20)
    status, ps = model.status, model.ps
    header = (
        f"ccsup top  pid {status.get('pid', '?')}  up {format_age(now - status['started_at']) if status.get('started_at') else '?'}"
        f"  {len([s for s in ps.get('slots', []) if s.get('state') == 'held'])} held"
        f"  {len(ps.get('waits', []))} waiting"
    )
    clock = time.strftime("%H:%M:%S", time.localtime(now))
    out: list[Line] = [Line(_cut(header, width - 9).ljust(width - 9) + " " + clock, "title")]
    if model.problem:
        out.append(Line(_cut(model.problem, width), "failed"))
    budget = max(height - 3 - len(out), 4)  # the message and help lines, and one spare

    keys = key_rows(model)
    key_lines = [
        Line(
            _cut(f"{'KEY':<22}{'CAP':>4}{'HELD':>6}{'WAIT':>6}  {'PAUSED':<16}RATE", width),
            "header",
        )
    ]
    for key, cap, held, waiting, paused, rate in keys[: max(budget // 4, 1)]:
        style = (
            "paused" if paused != "-" else ("waiting" if waiting else ("held" if held else "plain"))
        )
        text = f"{_cut(key, 21):<22}{cap:>4}{held:>6}{waiting:>6}  {paused:<16}{rate}"
        key_lines.append(Line(_cut(text, width), style))
    if len(keys) > budget // 4:
        key_lines.append(Line(f"... {len(keys) - budget // 4} more keys", "dim"))

    recent = model.recent[:5]
    recent_lines = [
        Line(_cut(f"{'LAST':<9}{'KEY':<14}{'OUTCOME':<12}{'RUN':>8}  ENDED", width), "header")
    ]
    for record in recent:
        outcome = _outcome(record)
        run = format_age(record.get("run_s")) if record.get("run_s") is not None else "-"
        ended = (
            time.strftime("%H:%M:%S", time.localtime(record["ended_at"]))
            if record.get("ended_at")
            else "-"
        )
        style = "plain" if outcome in ("ok", "exit 0") else "failed"
        recent_lines.append(
            Line(
                _cut(
                    f"{record['id'][:8]:<9}{_cut(record.get('key', '?'), 13):<14}{outcome:<12}{run:>8}  {ended}",
                    width,
                ),
                style,
            )
        )
    if not recent:
        recent_lines = []

    left = budget - len(key_lines) - len(recent_lines) - 2
    holders = [s for s in ps.get("slots", []) if s.get("state") == "held" and s.get("turn")]
    waits = ps.get("waits", [])
    share = max(left // 2, 2) if waits else max(left, 2)
    who = width >= WIDE  # room for a HOLDER column: who asked (session/agent, else the pid)
    holder_col = f"{'HOLDER':<{HOLDER_WIDTH}}" if who else ""
    holder_lines = [
        Line(
            _cut(
                f"{'TURN':<9}{'KEY':<14}{'AGE':>7}{'CPU':>7}{'MEM':>7}{'PRED':>7}  {holder_col}COMMAND",
                width,
            ),
            "header",
        )
    ]
    for slot in holders[: max(share - 1, 1)]:
        used = model.usage.get(slot["turn"])
        cpu = f"{used.cpu_percent:.0f}%" if used and used.cpu_percent is not None else "-"
        tree = (slot.get("usage") or {}).get("mem")  # the whole tree, as its guard sampled it
        mem = _size(tree) if isinstance(tree, int) else _size(used.rss_bytes) if used else "-"
        pred = _size(slot.get("predicted_mem"))  # its key's predicted peak ([memory])
        since = slot.get("since")
        age = format_age(now - since) if isinstance(since, (int, float)) else "-"
        holder = _holder_cell(slot) if who else ""
        text = f"{slot['turn'][:8]:<9}{_cut(slot['key'], 13):<14}{age:>7}{cpu:>7}{mem:>7}{pred:>7}  {holder}{format_command(slot.get('argv'))}"
        holder_lines.append(Line(_cut(text, width), "held", Row(slot["turn"], slot["key"])))
    if len(holders) > share - 1:
        holder_lines.append(Line(f"... {len(holders) - share + 1} more holders", "dim"))
    queue_lines = []
    if waits:
        queue_lines.append(
            Line(
                _cut(
                    f"{'WAITING':<9}{'KEY':<14}{'POS':>4}{'FOR':>7}  {'WHY':<13}{holder_col}COMMAND",
                    width,
                ),
                "header",
            )
        )
        room = max(left - len(holder_lines) - 1, 1)
        for wait in waits[:room]:
            since = wait.get("since")
            age = format_age(now - since) if isinstance(since, (int, float)) else "-"
            text = (
                f"{wait['id'][:8]:<9}{_cut(wait['key'], 13):<14}{wait.get('position', '?'):>4}{age:>7}  "
                f"{why_word(wait.get('why')):<13}{_holder_cell(wait) if who else ''}"
                f"{format_command(wait.get('argv'))}"
            )
            queue_lines.append(Line(_cut(text, width), "waiting", Row(wait["id"], wait["key"])))
        if len(waits) > room:
            queue_lines.append(Line(f"... {len(waits) - room} more waiting", "dim"))
    else:
        queue_lines.append(Line("no one waiting", "dim"))

    body = (
        key_lines
        + [Line("", "plain")]
        + holder_lines
        + queue_lines
        + [Line("", "plain")]
        + recent_lines
    )
    out += body[: max(height - 2 - len(out), 0)]
    out += [Line("", "plain")] * max(height - 2 - len(out), 0)
    out.append(Line(_cut(message, width), "failed" if message.startswith("!") else "plain"))
    out.append(Line(_cut(HELP, width), "dim"))
    return out[:height]


def _outcome(record: dict) -> str:
    outcome = record.get("outcome") or record.get("state") or "?"
    if outcome == "exit":
        return f"exit {record.get('exit_code')}"
    if outcome == "signal":
        return f"signal {record.get('signal')}"
    return str(outcome)
