"""Descendants of a process, found by walking /proc/<pid>/task/<tid>/children.

Design note. A child is listed under the *thread* that forked it, and an orphan reparented to a
subreaper may land on any live thread of it, so every thread's `children` file is read (for the
common single-threaded process, only its main thread's, known from the thread count in `stat`).
A `children` file gives at most about a page a read (700-800 pids), so one that fills most of a
page is read on to its end: a guard with a thousand orphans sees them all.
Walking down from the guard finds exactly its descendants without reading every process on the
machine; its cost is two small reads a process (about 16-22 us each process on these machines,
so 50 processes take under 1 ms and 500 about 8-11 ms). The walk is a snapshot: a
process that forks or exits meanwhile may be missed or listed after it died; callers scan again
(every interval and on every SIGCHLD) and judge liveness through guardd.procs, never through a
scan alone. Files are read with os.open/os.read: the buffered `open()` costs several times more.

A guard scans the same tree again and again, so `Scanner` keeps each descendant's `stat` and (for
a single-threaded one) its `children` file open and re-reads them with pread: one system call
instead of three, which brings a scan of 500 from about 9 ms to under 4. This is as safe against
pid reuse as opening by path: a /proc file opened on a process stays bound to that process (the
kernel's struct pid, not the number); once it is reaped a read fails with ESRCH, even if the number
now names another process. The start ticks read through a held file are still compared with those
first seen, and a mismatch or failure closes it and looks the pid up afresh by path, as a first
scan does. Files of pids not seen in a scan are closed; at most a quarter of the open-file limit
is held (beyond it, pids are read by path every time), so a large tree cannot starve the guard.

`descendants()` is stateless; a Scanner holds only open files, gone with the process (close()).
Standard library only.
"""

from __future__ import annotations

import os

from .procs import Stat, parse_stat


def _read(path: str) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None  # gone (ENOENT/ESRCH) or not ours to read: not a descendant we can act on
    try:
        return _read_all(fd)
    except OSError:
        return None
    finally:
        os.close(fd)


def _read_all(fd: int, at: int | None = None) -> bytes:
    """The whole file: /proc's seq files give at most a page a read (a subreaper's `children`
    with more than about 800 pids is longer), so read on until the end. `at`: pread from there."""
    if at is None:
        data = os.read(fd, 65536)
    else:
        data = os.pread(fd, 65536, at)
    if len(data) < 2048:
        return data  # well short of a page (a read stops near a page's end): that was all
    chunks = [data]
    size = len(data) + (at or 0)
    while True:
        more = os.read(fd, 65536) if at is None else os.pread(fd, 65536, size)
        if not more:
            return b"".join(chunks)
        chunks.append(more)
        size += len(more)


def _open(path: str) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return -1


def _stat(pid: int) -> Stat | None:
    data = _read(f"/proc/{pid}/stat")
    if not data:
        return None
    return parse_stat(pid, data)


def children_of(pid: int, threads: int = 0) -> list[int]:
    """Children of every thread of pid (threads: its thread count when known, 0 to look)."""
    if threads == 1:
        data = _read(f"/proc/{pid}/task/{pid}/children")
        return [int(c) for c in data.split()] if data else []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    found: list[int] = []
    for tid in tids:
        data = _read(f"/proc/{pid}/task/{tid}/children")
        if data:
            found.extend(int(c) for c in data.split())
    return found


def descendants(root: int) -> dict[int, Stat]:
    """Every descendant of root (zombies included), by pid; root itself is not included."""
    found: dict[int, Stat] = {}
    todo = children_of(root)
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        proc = _stat(pid)
        if proc is None:
            continue  # exited and reaped since its parent's list was read
        found[pid] = proc
        # A zombie leader may still have live threads with children: look at every thread then.
        todo.extend(children_of(pid, 0 if proc.zombie else proc.threads))
    return found


def _pread(fd: int) -> bytes | None:
    try:
        return _read_all(fd, 0)
    except OSError:
        return None  # ESRCH: that process is gone (its pid may be another's by now)


class Scanner:
    """`descendants(root)` again and again, re-reading held /proc files (see the design note)."""

    def __init__(self, root: int, max_held: int | None = None):
        self.root = root
        if max_held is None:
            max_held = max(0, min(4096, (os.sysconf("SC_OPEN_MAX") - 64) // 8))
        self.max_held = max_held
        # pid -> [start, stat fd, children fd or -1]
        self._held: dict[int, list] = {}

    def descendants(self) -> dict[int, Stat]:
        found: dict[int, Stat] = {}
        todo = children_of(self.root)
        while todo:
            pid = todo.pop()
            if pid in found:
                continue
            proc = self._stat(pid)
            if proc is None:
                continue
            found[pid] = proc
            held = self._held.get(pid)
            if held is not None and proc.threads == 1 and not proc.zombie:
                if held[2] < 0:
                    held[2] = _open(f"/proc/{pid}/task/{pid}/children")
                data = _pread(held[2]) if held[2] >= 0 else None
                if data is not None:
                    todo.extend(int(c) for c in data.split())
                    continue
            todo.extend(children_of(pid, 0 if proc.zombie else proc.threads))
        for pid in [p for p in self._held if p not in found]:
            self._drop(pid)
        return found

    def _stat(self, pid: int) -> Stat | None:
        held = self._held.get(pid)
        if held is not None:
            data = _pread(held[1])
            if data:
                got = parse_stat(pid, data)
                if got.start == held[0]:
                    return got
            self._drop(pid)  # gone, or (never through a held file, but checked) another process
        fd = _open(f"/proc/{pid}/stat")
        if fd < 0:
            return None
        try:
            data = os.read(fd, 65536)
        except OSError:
            data = b""
        if not data:
            os.close(fd)
            return None
        got = parse_stat(pid, data)
        if got.zombie or len(self._held) >= self.max_held:
            os.close(fd)
        else:
            self._held[pid] = [got.start, fd, -1]
        return got

    def _drop(self, pid: int) -> None:
        _, stat_fd, children_fd = self._held.pop(pid)
        os.close(stat_fd)
        if children_fd >= 0:
            os.close(children_fd)

    def held(self) -> int:
        """How many processes' files are held open (for tests)."""
        return len(self._held)

    def close(self) -> None:
        for pid in list(self._held):
            self._drop(pid)
