"""File work taken off the event loop: fsyncs after appends, removals of spent files, and turns'
log files, made ahead.

Knows paths and one thread; nothing of what the files hold.

Design note. On a busy disk an fsync or even an unlink can wait for the filesystem's journal for
milliseconds: with 400 turns starting, fsyncs of queue.journal were 40 % of the event loop's time,
and with 500 stopping, removing spent guard records was 45 %. Neither result is needed before the
loop goes on: an append already survives a SIGKILL of the supervisor once written (the page cache
is the kernel's), so its fsync only narrows what a power loss can take; and a spent guard record
serves nobody. Creating a file is the same kind of wait (1 ms each on a busy disk, against a few
microseconds to open one that exists): a turn's log directory and files are made here while it
waits for a slot, or while its guard is being started, so that following it only opens them. One
daemon thread does all three, many at once, in order of arrival per kind, files to make first.

The state question: nothing is stored. Stopped half-way (the supervisor killed), a pending fsync
is the kernel's to do, and a spent file that was not yet removed stays behind, which is harmless
(a guard record is read only through a slot record that names it, and that one is released).
Files made ahead are empty and the start makes them anyway when they are missing (and says so when
it cannot); a turn that never starts leaves an empty log directory, pruned like any other.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("ccsup.filework")


class FileWorker(threading.Thread):
    """fsync and unlink soon, in this thread. Started at the first request; `stop` drains it."""

    def __init__(self) -> None:
        super().__init__(name="ccsup-filework", daemon=True)
        self._sync: set[str] = set()
        self._unlink: list[str] = []
        self._make: list[tuple[str, tuple[str, ...]]] = []
        self._cond = threading.Condition()
        self._stopping = False
        self._busy = False  # a batch taken from the sets is being worked on

    def sync_soon(self, path: str | Path) -> None:
        self._want(lambda: self._sync.add(os.fspath(path)))

    def unlink_soon(self, path: str | Path) -> None:
        self._want(lambda: self._unlink.append(os.fspath(path)))

    def make_soon(self, directory: str | Path, names: tuple[str, ...]) -> None:
        """The directory (0700, parents too) and the empty files `names` in it, unless there."""
        self._want(lambda: self._make.append((os.fspath(directory), names)))

    def _want(self, add: Callable[[], object]) -> None:
        with self._cond:
            add()
            if not self.is_alive() and not self._stopping:
                self.start()
            self._cond.notify()

    def run(self) -> None:
        while True:
            with self._cond:
                while not (self._make or self._sync or self._unlink or self._stopping):
                    self._cond.wait()
                make, self._make = self._make, []
                sync, self._sync = self._sync, set()
                unlink, self._unlink = self._unlink, []
                stopping = self._stopping
                self._busy = True
            for directory, names in make:
                _make(directory, names)
            for path in sync:
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                except OSError as e:  # replaced or removed since: its replacement was synced
                    log.debug("unable to sync %s: %s", path, e.strerror)
            for path in unlink:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
                except OSError as e:
                    log.warning("unable to remove %s: %s", path, e.strerror)
            with self._cond:
                self._busy = False
                self._cond.notify_all()
            if stopping and not (self._make or self._sync or self._unlink):
                return

    def drain(self, timeout: float = 10.0) -> bool:
        """Wait until everything asked so far is done (for tests and orderly ends)."""
        with self._cond:
            return self._cond.wait_for(
                lambda: (
                    not (self._make or self._sync or self._unlink or self._busy)
                    or not self.is_alive()
                ),
                timeout,
            )

    def stop(self, timeout: float = 10.0) -> None:
        """Do what is pending, then end the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self.is_alive():
            self.join(timeout)
        else:  # never started, or ended: do the rest here
            self.run()


def _make(directory: str, names: tuple[str, ...]) -> None:
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        for name in names:
            path = os.path.join(directory, name)
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))  # the owner's
    except OSError as e:  # the start makes them again, and reports what stops it
        log.debug("unable to make %s ahead: %s", directory, e.strerror)
