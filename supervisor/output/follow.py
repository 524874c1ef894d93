"""Following a turn's logs as its guard writes them (guardd.output): inotify, read at offsets.

Design note. The guard appends CMD's output to `<state>/turns/<id>/<stream>.log` itself, so that
output never waits for a supervisor (and survives one's death); the supervisor publishes
`turn.<id>.stdout|stderr` from those files. One inotify instance per event loop (`Watcher`) wakes
the loop when a followed log is written (IN_MODIFY); each `LogFollower` then reads from the offset
after the last byte it handed on, up to the end, in 64 KiB reads, as the pipe reads were: the
offsets of what it hands on are the log's own, so chunks tile the log, and a follower started at
an offset (an adopting supervisor's) goes on from there. A backlog larger than READS_A_TURN reads
is read in several passes of the loop (call_soon), so one busy turn cannot hold the loop.
Rejected: polling the files on a timer (latency or CPU, for 500 idle turns); a thread per turn.

inotify is reached through ctypes (libc's inotify_init1/inotify_add_watch/inotify_rm_watch): the
standard library has no binding. Where it cannot be used (no libc symbol, or out of instances or
watches), the follower reads on a short timer instead (POLL_EVERY), and says so once.

State: none; a follower holds an fd on its log and an offset, both gone with it.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os
import struct
from collections.abc import Callable

log = logging.getLogger("ccsup.follow")

READ = 65536
READS_A_TURN = 16  # reads of one follower in one pass of the loop, then it yields
POLL_EVERY = 0.05  # seconds between reads where inotify cannot be used
_IN_MODIFY = 0x2
_IN_NONBLOCK = 0o4000
_IN_CLOEXEC = 0o2000000
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (then len bytes of name)


class _Libc:
    def __init__(self) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self.init1 = libc.inotify_init1
        self.add_watch = libc.inotify_add_watch
        self.add_watch.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)
        self.rm_watch = libc.inotify_rm_watch
        self.rm_watch.argtypes = (ctypes.c_int, ctypes.c_int)


_libc: _Libc | None = None


class Watcher:
    """One inotify instance on an event loop: calls a follower back when its log is modified."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        global _libc
        self.loop = loop
        self.callbacks: dict[int, Callable[[], None]] = {}
        if _libc is None:
            _libc = _Libc()
        self.libc = _libc
        fd = self.libc.init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"unable to start inotify: {os.strerror(err)}")
        self.fd = fd
        loop.add_reader(fd, self._on_readable)

    def watch(self, path: str, callback: Callable[[], None]) -> int:
        wd = self.libc.add_watch(self.fd, os.fsencode(path), _IN_MODIFY)
        if wd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"unable to watch {path}: {os.strerror(err)}")
        self.callbacks[wd] = callback
        return wd

    def unwatch(self, wd: int) -> None:
        if self.callbacks.pop(wd, None) is not None:
            self.libc.rm_watch(self.fd, wd)  # EINVAL when the file is gone already: nothing to do

    def _on_readable(self) -> None:
        woken: dict[int, None] = {}
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            pos = 0
            while pos + _EVENT.size <= len(data):
                wd, _mask, _cookie, length = _EVENT.unpack_from(data, pos)
                pos += _EVENT.size + length
                woken[wd] = None
        for wd in woken:
            callback = self.callbacks.get(wd)
            if callback is not None:
                callback()


_watchers: dict[asyncio.AbstractEventLoop, Watcher | None] = {}


def watcher(loop: asyncio.AbstractEventLoop) -> Watcher | None:
    """The loop's Watcher, made at the first call; None where inotify cannot be used."""
    if loop not in _watchers:
        try:
            _watchers[loop] = Watcher(loop)
        except (OSError, AttributeError) as e:
            log.warning("following logs on a %s s timer: %s", POLL_EVERY, e)
            _watchers[loop] = None
    return _watchers[loop]


class LogFollower:
    """One log followed from an offset: each new read handed to `on_data(offset, data)`."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        path: str,
        on_data: Callable[[int, bytes], None],
        offset: int = 0,
    ):
        self.loop = loop
        self.path = path
        self.on_data = on_data
        self.offset = offset
        self.fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._watcher = watcher(loop)
        self._wd: int | None = None
        if self._watcher is not None:
            try:
                self._wd = self._watcher.watch(path, self._wake)
            except OSError as e:
                log.warning("following %s on a timer: %s", path, e)
        if self._wd is None:
            self._timer = loop.call_later(POLL_EVERY, self._tick)
        self._wake()  # what is there already

    def _wake(self) -> None:
        if not self._scheduled and self.fd >= 0:
            self._scheduled = True
            self.loop.call_soon(self._pass)

    def _tick(self) -> None:
        self._timer = None
        if self.fd >= 0:
            self.read(READS_A_TURN)
            self._timer = self.loop.call_later(POLL_EVERY, self._tick)

    def _pass(self) -> None:
        self._scheduled = False
        if self.fd >= 0 and self.read(READS_A_TURN):
            self._wake()  # more is there: the next pass of the loop

    def read(self, reads: int | None = None) -> bool:
        """Hand on what the log holds past the offset (reads: at most that many); True when it
        stopped with more to read."""
        n = 0
        while self.fd >= 0:
            if reads is not None and n >= reads:
                return True
            try:
                data = os.pread(self.fd, READ, self.offset)
            except OSError:
                return False
            if not data:
                return False
            n += 1
            offset = self.offset
            self.offset += len(data)
            self.on_data(offset, data)
        return False

    def close(self) -> None:
        if self._wd is not None and self._watcher is not None:
            self._watcher.unwatch(self._wd)
            self._wd = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
