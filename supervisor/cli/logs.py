"""`ccsup logs ID | --key K [-f] [-t] [-n N] [--stdout | --stderr]`: a turn's output.

By default both streams, merged in the order they were read (each line marked `out | ` or
`err | `); `--stdout` or `--stderr` prints one stream alone, its exact bytes (unless -t or -n,
which work in lines). `-t` puts the time a line started to arrive before it (from the time index
beside the log, supervisor.output.line_times); `-n N` starts at the last N lines; `-f` keeps
printing until the turn ends (woken by the turn's events on the bus), and works with -t and -n.
`--key K` prints the logs of the turns of K that hold a slot now, each line led by the turn's
short id; with -f it also follows each turn of K that starts meanwhile, until Ctrl-C (exit 130).
`--session S` does the same for the turns whose holder session is S (`run --session S`).

A turn still waiting for a slot says so on stderr (`turn X is waiting: position 2, key_full`):
without -f the command then exits 0 having printed no output; with -f it follows the turn once it
starts. A turn whose logs were pruned ([logs] keep or max_bytes) is reported as pruned, with when
and why (supervisor.output.retention's marker). Merging is by arrival time: two pipes carry no
order between them, so lines read in the same millisecond may come in either order.
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..caps import SlotState
from ..errors import CcsupError, UnknownTurn
from .options import complete_ids, complete_keys, key_option, turn_id_argument
from .where import where

if TYPE_CHECKING:
    from ..client.control import Client
    from .views.log_lines import Line, LineReader

STREAM_LABELS = {"stdout": "out", "stderr": "err"}


def _refuse_pruned(turn_id: str, path: Path) -> None:
    """A turn whose logs were pruned: say so, when and why (CcsupError)."""
    from ..output.retention import marker_of

    marker = marker_of(path.parent)
    if marker is None:
        return
    when = marker.get("pruned_at")
    shown = (
        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when))
        if isinstance(when, (int, float))
        else "an unknown time"
    )
    raise CcsupError(
        f"turn {turn_id}: its logs were pruned at {shown} ({marker.get('reason', 'unknown')}); "
        "see [logs] keep and max_bytes"
    )


def _waiting(ps: dict, turn_id: str) -> dict | None:
    return next((w for w in ps.get("waits", []) if w.get("id") == turn_id), None)


def _turn_active(ps: dict, turn_id: str) -> bool:
    return any(s.get("turn") == turn_id for s in ps.get("slots", [])) or (
        _waiting(ps, turn_id) is not None
    )


def _say_waiting(turn_id: str, wait: dict) -> None:
    why = (wait.get("why") or {}).get("reason") or "waiting for a slot"
    click.echo(
        f"turn {turn_id} is waiting: position {wait.get('position', '?')} of key "
        f"{wait.get('key', '?')}, {why}",
        err=True,
    )


class Printer:
    """Lines of several readers, merged, to stdout; `tail` keeps only the last N of the first
    batch (what the logs held when the command started)."""

    def __init__(self, timestamps: bool, marker: bool, tail: int | None):
        self.timestamps = timestamps
        self.marker = marker
        self.tail = tail
        self.out = sys.stdout.buffer

    def show(self, readers: list[LineReader], *, final: bool = False) -> None:
        from .views.log_lines import merge, render

        batches: list[list[Line]] = []
        for reader in readers:
            lines = reader.lines()
            if final:
                lines += reader.rest()
            batches.append(lines)
        lines = merge(batches)
        if self.tail is not None:
            lines = lines[-self.tail :] if self.tail else []
            self.tail = None
        for line in lines:
            self.out.write(render(line, timestamps=self.timestamps, marker=self.marker))
        self.out.flush()


def _readers(client: Client, turn_id: str, streams: list[str], prefix: str = "") -> list:
    from .views.log_lines import LineReader

    return [
        LineReader(client.paths.output_log(turn_id, s), prefix + STREAM_LABELS[s]) for s in streams
    ]


@click.command()
@click.argument(
    "turn_id",
    metavar="[ID]",
    required=False,
    callback=lambda c, p, v: None if v is None else turn_id_argument(c, p, v),
    shell_complete=complete_ids,
)
@click.option(
    "--key",
    callback=lambda c, p, v: None if v is None else key_option(c, p, v),
    shell_complete=complete_keys,
    metavar="KEY",
    help="The turns of this key that hold a slot now (with -f: and those that start later).",
)  # fmt: skip
@click.option(
    "--session",
    metavar="S",
    help="The same for the turns of this holder session (--session of run).",
)
@click.option("-f", "--follow", is_flag=True, help="Keep printing until the turn ends.")
@click.option("--stdout", "only", flag_value="stdout", help="Only stdout, its exact bytes.")
@click.option("--stderr", "only", flag_value="stderr", help="Only stderr, its exact bytes.")
@click.option(
    "-t", "--timestamps", is_flag=True, help="Put the time each line started to arrive before it."
)
@click.option(
    "-n", "--tail", type=click.IntRange(min=0), metavar="N", help="Start at the last N lines."
)
@click.pass_context
def logs(
    ctx: click.Context,
    turn_id: str | None,
    key: str | None,
    session: str | None,
    follow: bool,
    only: str | None,
    timestamps: bool,
    tail: int | None,
) -> None:
    """A turn's output: both streams merged (`out |`, `err |`), or one with --stdout/--stderr.

    \b
    Examples:
      ccsup logs 3f2a -f -t          follow a turn, each line with its time
      ccsup logs 3f2a --stderr -n 20 the last 20 lines of its stderr
      ccsup logs --key codex -f      every turn of codex, as they run
      ccsup logs --session s1 -f     every turn of session s1, as they run"""
    if [turn_id, key, session].count(None) != 2:
        raise click.UsageError("give one of a turn ID, --key KEY and --session S")
    streams = [only] if only else ["stdout", "stderr"]
    client = where(ctx).client()
    try:
        if key is not None or session is not None:
            _follow_key(ctx, client, key, session, streams, follow, timestamps, tail)
            return
        assert turn_id is not None
        for stream in streams:
            _refuse_pruned(turn_id, client.paths.output_log(turn_id, stream))
        if only and not timestamps and tail is None:
            _exact(ctx, client, turn_id, only, follow)
            return
        printer = Printer(timestamps, marker=only is None, tail=tail)
        readers = _readers(client, turn_id, streams)
        running = client.running()
        if not running or not follow:
            if running:
                wait = _waiting(client.ps(), turn_id)
                if wait is not None:
                    _say_waiting(turn_id, wait)
                    return
            if not any(r.exists() for r in readers):
                if follow:
                    client.check_running()  # nothing to print and nothing to follow: exit 3
                if not _known(client, turn_id):
                    raise UnknownTurn(turn_id, client.state_dir)
                raise CcsupError(f"no output of turn {turn_id} in {readers[0].log.parent}")
            printer.show(readers, final=True)
            return
        _follow_turn(ctx, client, turn_id, readers, printer)
    finally:
        client.close()


def _known(client: Client, turn_id: str) -> bool:
    """Whether the history knows the turn (one with no output yet, or whose logs are gone)."""
    from ..history import db as history

    try:
        return history.show(client.state_dir, turn_id) is not None
    except history.HistoryError:
        return False


def _exact(ctx: click.Context, client: Client, turn_id: str, stream: str, follow: bool) -> None:
    """One stream's exact bytes (as `ccsup logs` always printed them), following with -f."""
    from ..client.subscription import is_terminal
    from .output import OutputFollower

    path = client.paths.output_log(turn_id, stream)
    out = OutputFollower(path, sys.stdout.buffer)
    running = client.running()
    if running:
        wait = _waiting(client.ps(), turn_id)
        if wait is not None:
            _say_waiting(turn_id, wait)
            if not follow:
                return
    if follow and not running and not path.exists():
        client.check_running()  # nothing to print and nothing to follow: NotRunning
    if not follow or not running:
        if not out.copy_from_file():
            if not _known(client, turn_id):
                raise UnknownTurn(turn_id, client.state_dir)
            raise CcsupError(f"unable to read the {stream} of turn {turn_id}: no file {path}")
        out.close()
        return
    with client.subscribe([f"turn.{turn_id}."]) as sub:
        active = _turn_active(client.ps(), turn_id)
        if not active and not path.exists():
            if not _known(client, turn_id):
                raise UnknownTurn(turn_id, client.state_dir)
            raise CcsupError(
                f"unable to follow turn {turn_id}: it is not running and has no {stream} log"
            )
        out.drain()
        try:
            while active:
                event = sub.recv(0.5)
                out.drain()
                if event is None:
                    active = client.running()
                elif is_terminal(event[0]):
                    break
        except KeyboardInterrupt:
            ctx.exit(130)
        out.drain()
        out.close()


def _follow_turn(
    ctx: click.Context, client: Client, turn_id: str, readers: list, printer: Printer
) -> None:
    from ..client.subscription import is_terminal

    with client.subscribe([f"turn.{turn_id}."]) as sub:
        ps = client.ps()
        wait = _waiting(ps, turn_id)
        if wait is not None:
            _say_waiting(turn_id, wait)
        active = _turn_active(ps, turn_id)
        if not active and not any(r.exists() for r in readers):
            raise CcsupError(f"unable to follow turn {turn_id}: it is not running and has no log")
        printer.show(readers)
        try:
            while active:
                event = sub.recv(0.5)
                printer.show(readers)
                if event is None:
                    active = client.running()
                elif is_terminal(event[0]):
                    break
        except KeyboardInterrupt:
            ctx.exit(130)
        printer.show(readers, final=True)


def _follow_key(
    ctx: click.Context,
    client: Client,
    key: str | None,
    session: str | None,
    streams: list[str],
    follow: bool,
    timestamps: bool,
    tail: int | None,
) -> None:
    """The logs of every turn of `key` (or of holder `session`) holding a slot, each line led by
    its short id; with `follow`, also each such turn that starts, until Ctrl-C."""
    from ..client.subscription import is_terminal

    printer = Printer(timestamps, marker=True, tail=tail)
    turns: dict[str, list] = {}
    what = f"key {key}" if key is not None else f"session {session}"

    def matches(entry: dict) -> bool:
        if key is not None:
            return entry.get("key") == key
        return (entry.get("holder") or {}).get("session") == session

    def add(turn_id: str) -> None:
        if turn_id not in turns:
            turns[turn_id] = _readers(client, turn_id, streams, prefix=f"{turn_id[:8]} ")

    def show(final: bool = False) -> None:
        printer.show([r for readers in turns.values() for r in readers], final=final)

    def started(turn_id: str, body: dict) -> bool:
        if key is not None:
            return body.get("key") == key
        slots = client.ps().get("slots", [])  # the event has no holder: its slot has
        return any(s.get("turn") == turn_id and matches(s) for s in slots)

    with client.subscribe(["turn."]) if follow else contextlib.nullcontext() as sub:
        ps = client.ps()
        for slot in ps.get("slots", []):
            if matches(slot) and slot.get("turn") and slot.get("state") == SlotState.HELD:
                add(slot["turn"])
        for wait in ps.get("waits", []):
            if matches(wait):
                _say_waiting(wait["id"], wait)
        if not turns and not follow:
            click.echo(f"no turn of {what} is running", err=True)
            return
        show()
        try:
            while sub is not None:
                event = sub.recv(0.5)
                if event is not None:
                    topic, body = event
                    turn_id = topic.split(".")[1]
                    if topic.endswith(".started") and started(turn_id, body):
                        add(turn_id)
                    show()
                    if is_terminal(topic) and turn_id in turns:
                        for reader in turns.pop(turn_id):
                            printer.show([reader], final=True)
                else:
                    show()
        except KeyboardInterrupt:
            show(final=True)
            ctx.exit(130)
        show(final=True)
