"""`ccsup run`'s terminal: which stdin mode a turn gets, and `-t`'s raw mode and window size.

The mode (supervisor.wire.args.STDIN_MODES): "tty" with -t/--tty; "pipe" with -i, or when this
process's stdin is a pipe or a file (forwarded to the turn, end of input included); "null" when
it is a terminal and -i is not given, so that a program that reads its stdin to the end before it
starts (`codex exec`, Qwen Code) starts at once instead of waiting for Ctrl-D.

With -t the turn's stdin, stdout and stderr are a pty the guard's CMD takes as its controlling
terminal (guardd.child). Here, once the turn has started, the user's terminal is put in raw mode
(no echo, no line editing, no signals from keys: ^C and ^Z travel as bytes to the pty, whose line
discipline signals CMD's foreground group), its input is forwarded as it is typed
(supervisor.cli.run.stdin_forward), and each SIGWINCH sends the new size (`send` with `winsize`;
the handler only notes it, the follow loop sends it). The terminal's settings are restored on
every way out: the end of the turn, an error, SIGTERM or SIGHUP (made exceptions here so the
restore runs), and at exit as a last resort (atexit). SIGKILL cannot be caught: `stty sane`
then. Knows termios and signals; nothing of events or the supervisor's replies.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import termios
import tty
from types import FrameType


def stdin_mode(*, want_tty: bool, interactive: bool, fd: int = 0) -> str:
    if want_tty:
        return "tty"
    if interactive or not os.isatty(fd):
        return "pipe"
    return "null"


def window_size(fd: int = 0) -> list[int] | None:
    """[rows, cols] of the terminal on fd; None when it is not one or says 0."""
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return None
    return [size.lines, size.columns] if size.lines and size.columns else None


class _Ended(Exception):
    """SIGTERM or SIGHUP while the terminal is raw: unwinds so that the restore runs."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class RawTerminal:
    """The user's terminal in raw mode while the turn runs; `restore()` is safe to call twice."""

    def __init__(self, fd: int = 0):
        self.fd = fd
        self.saved: list | None = None
        self.resized = False  # a SIGWINCH came: the follow loop sends the size
        self._old_handlers: dict[int, object] = {}

    def enter(self) -> None:
        self.saved = termios.tcgetattr(self.fd)
        atexit.register(self.restore)
        for signum in (signal.SIGTERM, signal.SIGHUP):
            self._old_handlers[signum] = signal.signal(signum, self._on_ending_signal)
        self._old_handlers[signal.SIGWINCH] = signal.signal(signal.SIGWINCH, self._on_winch)
        tty.setraw(self.fd, termios.TCSANOW)

    def _on_winch(self, signum: int, frame: FrameType | None) -> None:
        self.resized = True

    def _on_ending_signal(self, signum: int, frame: FrameType | None) -> None:
        raise _Ended(signum)

    def restore(self) -> None:
        saved, self.saved = self.saved, None
        if saved is None:
            return
        try:
            termios.tcsetattr(self.fd, termios.TCSAFLUSH, saved)
        except termios.error:
            pass  # the terminal is gone (SIGHUP): nothing to restore
        for signum, handler in self._old_handlers.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        self._old_handlers.clear()
        atexit.unregister(self.restore)


def ended_by_signal(error: BaseException) -> int | None:
    """The signal number when `error` is a RawTerminal's SIGTERM/SIGHUP unwinding, else None."""
    return error.signum if isinstance(error, _Ended) else None


def tty_needed_message() -> str:
    return "-t/--tty needs a terminal on stdin (here it is a pipe or a file); leave -t out"


def exit_for_signal(signum: int) -> None:
    """Exit as that signal would have ended us: its default action, after the restore."""
    signal.signal(signum, signal.SIG_DFL)
    sys.stdout.flush()
    os.kill(os.getpid(), signum)
