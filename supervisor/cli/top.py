"""`ccsup top`: a live view in the terminal: keys, holders (command, age, CPU, memory), the queue
with why each waits, the last turns; keys to cancel, pause, resume and follow a log.

Design note. Driven by the bus, not by a timer: top subscribes to `turn.`, `key.` and
`supervisor.`, and an event that changes what is shown (a turn's life, a pause; not its output)
marks the view stale; a stale view reads `ps` again (and the history's last turns), at most
MAX_REDRAWS times a second, however many events come. Between events it only wakes once a
second to move the ages and the clock, with a sample of the holders' CPU and memory (one pass
over /proc for every turn together, supervisor.web.usage), and reads `ps` every SAFETY_REFRESH
seconds in case an event was lost. It waits on the bus socket and the terminal together
(zmq.Poller), so a key press or an event is handled at once and nothing spins.

Keys: up/down (or j/k) select a holder or a waiter; `c` cancels it after a y/N question; `p`
pauses its key for a duration typed in (default 10m), `r` resumes the key; `l` leaves the view to
follow the turn's log (`ccsup logs -f`) until Ctrl-C or the turn's end; `q` (or Ctrl-C) quits.
Colour when the terminal has it and NO_COLOR is not set. Exit codes: 0, 3 when no supervisor
runs. Keeps no state.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

import click

from ..errors import CcsupError
from .where import where

if TYPE_CHECKING:
    from ..client.control import Client
    from .views.top import Row

ASK_MAX = 40  # characters a prompt's answer takes
STATUS_EVERY = 2.0  # seconds between two `status` reads, at a `ps` read (the header's pid, age)
MAX_REDRAWS = 5.0  # `ps` reads (and redraws for events) per second at most
TICK = 1.0  # seconds between two redraws without events (ages, clock, CPU)
SAFETY_REFRESH = 15.0  # seconds between two `ps` reads without events
QUIET_KINDS = ("stdout", "stderr", "truncated")  # turn events that change nothing shown
DEFAULT_PAUSE = "10m"


def relevant(topic: str) -> bool:
    """Whether an event changes what top shows."""
    if topic.startswith("turn."):
        return topic.rsplit(".", 1)[-1] not in QUIET_KINDS
    return topic.startswith(("key.", "supervisor.", "slot."))


class Sampler:
    """CPU (percent of a core since the last sample) and memory of each holder's processes."""

    def __init__(self) -> None:
        self.last: dict[str, tuple[float, float]] = {}  # turn -> (cpu seconds, when)

    def sample(self, slots: list[dict]) -> dict:
        from ..web import usage
        from .views.top import Usage

        now = time.monotonic()
        found = usage.sample(usage.works_of(slots))
        out = {}
        for turn, got in found.items():
            before = self.last.get(turn)
            percent = None
            if before is not None and now > before[1]:
                percent = max(0.0, (got.cpu_seconds - before[0]) / (now - before[1]) * 100)
            out[turn] = Usage(percent, got.rss_bytes)
            self.last[turn] = (got.cpu_seconds, now)
        for turn in set(self.last) - set(found):
            del self.last[turn]
        return out


class Top:
    def __init__(self, client: Client, state_dir: Any, argv_prefix: list[str]):
        from .views.top import Model

        self.client = client
        self.state_dir = state_dir
        self.argv_prefix = argv_prefix  # how to run `ccsup` again (for `l`)
        self.model = Model()
        self.sampler = Sampler()
        self.selected = 0
        self.message = ""
        self.rows: list[Row] = []
        self._status_at = 0.0

    # -- data

    def refresh(self) -> None:
        """`status` (every STATUS_EVERY s: a `ccsup restart` changes its pid and start), `ps`
        and the last turns of the history."""
        from ..history import db as history

        if not self.model.status or time.monotonic() - self._status_at >= STATUS_EVERY:
            self.model.status = self.client.status()
            self._status_at = time.monotonic()
        self.model.ps = self.client.ps()
        try:
            if history.history_path(self.state_dir).exists():
                self.model.recent = [dict(r) for r in history.query(self.state_dir, limit=5)]
        except history.HistoryError as e:
            self.message = f"! {e.message}"

    def sample(self) -> None:
        self.model.usage = self.sampler.sample(self.model.ps.get("slots", []))

    # -- drawing

    def draw(self, screen: Any, styles: dict[str, int]) -> None:
        from .views.top import render

        height, width = screen.getmaxyx()
        lines = render(self.model, time.time(), width - 1, height, self.message)
        self.rows = [line.row for line in lines if line.row is not None]
        self.selected = min(self.selected, max(len(self.rows) - 1, 0))
        chosen = self.rows[self.selected] if self.rows else None
        screen.erase()
        for y, line in enumerate(lines):
            style = "selected" if line.row is not None and line.row == chosen else line.style
            with contextlib.suppress(Exception):  # curses.error at the bottom-right corner
                screen.addstr(y, 0, line.text, styles.get(style, 0))
        screen.refresh()

    # -- actions

    def ask(self, screen: Any, styles: dict[str, int], question: str) -> str | None:
        """A line typed in on the message line (echoed), None on Escape: edited here key by key,
        since curses' getstr types an Escape into the field instead of leaving it."""
        import curses

        height, width = screen.getmaxyx()
        screen.nodelay(False)
        with contextlib.suppress(Exception):
            curses.curs_set(1)
        typed = ""
        try:
            while True:
                screen.move(height - 2, 0)
                screen.clrtoeol()
                shown = (question + typed)[: width - 1]
                screen.addstr(height - 2, 0, shown, styles.get("title", 0))
                screen.refresh()
                ch = screen.get_wch()
                if ch in ("\x1b", 27):  # Escape: the question is withdrawn
                    return None
                if ch in ("\n", "\r", curses.KEY_ENTER):
                    return typed.strip()
                if ch in ("\x7f", "\b", curses.KEY_BACKSPACE):
                    typed = typed[:-1]
                elif isinstance(ch, str) and ch.isprintable() and len(typed) < ASK_MAX:
                    typed += ch
        finally:
            with contextlib.suppress(Exception):
                curses.curs_set(0)
            screen.nodelay(True)

    def act(self, screen: Any, styles: dict[str, int], ch: int) -> bool:
        """One key press; False to quit."""
        import curses

        if ch in (ord("q"), ord("Q"), 27):
            return False
        if ch in (curses.KEY_DOWN, ord("j")):
            self.selected = min(self.selected + 1, max(len(self.rows) - 1, 0))
            return True
        if ch in (curses.KEY_UP, ord("k")):
            self.selected = max(self.selected - 1, 0)
            return True
        if ch == curses.KEY_RESIZE:
            return True
        row = self.rows[self.selected] if self.rows else None
        if ch in (ord("c"), ord("p"), ord("r"), ord("l")) and row is None:
            self.message = "! nothing selected"
            return True
        assert row is not None or ch not in (ord("c"), ord("p"), ord("r"), ord("l"))
        try:
            if ch == ord("c") and row is not None:
                answer = self.ask(
                    screen, styles, f"cancel turn {row.turn[:8]} of {row.key}? [y/N] "
                )
                if answer is not None and answer.lower() in ("y", "yes"):
                    result = self.client.cancel(row.turn)
                    self.message = f"turn {row.turn[:8]}: {result.get('state', 'cancelling')}"
                else:
                    self.message = "not cancelled"
            elif ch == ord("p") and row is not None:
                typed = self.ask(screen, styles, f"pause {row.key} for [{DEFAULT_PAUSE}]: ")
                if typed is None:
                    self.message = "not paused"
                    return True
                from ..config.values import duration

                seconds = duration(typed or DEFAULT_PAUSE, where="pause for")
                self.client.pause(row.key, for_=seconds)
                self.message = f"{row.key} paused for {typed or DEFAULT_PAUSE}"
            elif ch == ord("r") and row is not None:
                result = self.client.resume(row.key)
                self.message = f"resumed {', '.join(result.get('resumed') or []) or 'nothing'}"
            elif ch == ord("l") and row is not None:
                self.follow_log(screen, row)
        except CcsupError as e:
            self.message = f"! {e.message}"
        return True

    def follow_log(self, screen: Any, row: Row) -> None:
        """Leave the view for `ccsup logs -f -t ID` until it ends (Ctrl-C ends it, not top)."""
        import curses

        curses.def_prog_mode()
        curses.endwin()
        print(f"-- turn {row.turn} ({row.key}); Ctrl-C to return to ccsup top --", flush=True)
        # Ctrl-C is for the log's process: top outlives it. A handler, not SIG_IGN, which the
        # child would inherit (and Python would then not raise KeyboardInterrupt in it).
        old = signal.signal(signal.SIGINT, lambda signum, frame: None)
        try:
            subprocess.call([*self.argv_prefix, "logs", row.turn, "-f", "-t"])
        finally:
            signal.signal(signal.SIGINT, old)
        curses.reset_prog_mode()
        screen.clear()
        self.message = f"back from the log of {row.turn[:8]}"


def _styles(use_colour: bool) -> dict[str, int]:
    import curses

    styles = {
        "title": curses.A_BOLD | curses.A_REVERSE,
        "header": curses.A_BOLD,
        "selected": curses.A_REVERSE,
        "dim": curses.A_DIM,
    }
    if not use_colour:
        return styles
    curses.start_color()
    with contextlib.suppress(Exception):
        curses.use_default_colors()
    for n, (name, colour) in enumerate(
        (("held", curses.COLOR_GREEN), ("waiting", curses.COLOR_YELLOW)), start=1
    ):
        curses.init_pair(n, colour, -1)
        styles[name] = curses.color_pair(n)
    curses.init_pair(3, curses.COLOR_RED, -1)
    styles["paused"] = styles["failed"] = curses.color_pair(3)
    return styles


def loop(screen: Any, top: Top, sub: Any) -> None:
    import curses

    import zmq

    with contextlib.suppress(Exception):
        curses.curs_set(0)
    screen.nodelay(True)
    screen.keypad(True)
    with contextlib.suppress(Exception):  # Escape alone answers at once, not after 1 s
        curses.set_escdelay(25)
    use_colour = curses.has_colors() and not os.environ.get("NO_COLOR")
    styles = _styles(use_colour)
    poller = zmq.Poller()
    poller.register(sub.socket, zmq.POLLIN)
    poller.register(sys.stdin.fileno(), zmq.POLLIN)
    min_gap = 1.0 / MAX_REDRAWS
    last_read = last_tick = time.monotonic()
    top.sample()
    top.draw(screen, styles)
    stale = False
    while True:
        now = time.monotonic()
        due = [last_tick + TICK, last_read + SAFETY_REFRESH]
        if stale:
            due.append(last_read + min_gap)
        timeout = max(min(due) - now, 0.0)
        poller.poll(int(timeout * 1000) + 1)
        while (event := sub.recv(0.001)) is not None:
            stale = stale or relevant(event[0])
            if event[0].startswith("supervisor."):  # a restart: its pid and start are new
                top.model.status = {}
        while (ch := screen.getch()) != -1:
            if not top.act(screen, styles, ch):
                return
            top.draw(screen, styles)
        now = time.monotonic()
        read = (stale and now - last_read >= min_gap) or now - last_read >= SAFETY_REFRESH
        if read:
            try:
                top.refresh()
                top.model.problem = None
            except CcsupError as e:  # NotRunning included: said on screen, tried again later
                top.model.problem = f"! {e.message}"
            last_read, stale = now, False
        ticked = now - last_tick >= TICK
        if ticked:
            top.sample()
            last_tick = now
        if read or ticked:
            top.draw(screen, styles)


@click.command()
@click.pass_context
def top(ctx: click.Context) -> None:
    """A live view: keys, holders, the queue and the last turns; c/p/r/l act, q quits.

    \b
    Keys: up/down select a holder or waiter; c cancel it (asks y/N); p pause its
    key (asks how long, default 10m); r resume its key; l follow its log (Ctrl-C
    returns); q quit. NO_COLOR turns colour off.

    \b
    Example:
      ccsup top --state-dir ~/.local/state/ccsup"""
    import curses

    options = where(ctx)
    client = options.client()
    try:
        client.check_running()
        state_dir = options.state_dir()
        prefix = [sys.executable, "-m", "supervisor", "--state-dir", str(state_dir)]
        if options.config_option:
            prefix += ["--config", options.config_option]
        view = Top(client, state_dir, prefix)
        with client.subscribe(["turn.", "key.", "supervisor.", "slot."]) as sub:
            view.refresh()
            with contextlib.suppress(KeyboardInterrupt):
                curses.wrapper(loop, view, sub)
    finally:
        client.close()
