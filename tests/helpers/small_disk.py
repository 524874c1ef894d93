"""A small tmpfs to be the state directory, and a way to fill it up (a real ENOSPC).

Mounting needs root (CAP_SYS_ADMIN); a test that cannot mount is skipped with the reason.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_tmpfs(size: str = "2m") -> Iterator[Path]:
    """A fresh tmpfs of `size` mounted on a short path under /tmp, unmounted afterwards."""
    mountpoint = Path(tempfile.mkdtemp(prefix="ccsup-fs-", dir="/tmp"))
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(mountpoint)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        mountpoint.rmdir()
        pytest.skip(f"unable to mount a tmpfs on {mountpoint}: {done.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        # lazily: a process a failed test left behind may still have a file open there
        subprocess.run(["umount", "-l", str(mountpoint)], check=False)
        mountpoint.rmdir()


def _fill_once(fd: int) -> None:
    for size in (1 << 16, 4096, 512, 1):
        while True:
            try:
                os.write(fd, b"x" * size)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                break


@contextlib.contextmanager
def full(directory: Path) -> Iterator[Path]:
    """The disk under directory kept full: filled now, and whatever is freed (a process that
    truncates a file of its own, say sqlite's WAL) taken again every millisecond by a thread.
    On leaving, the filler is removed: the room is back."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    stop = threading.Event()

    def keep_full() -> None:
        while not stop.wait(0.001):
            _fill_once(fd)

    try:
        _fill_once(fd)
        keeper = threading.Thread(target=keep_full, daemon=True)
        keeper.start()
        try:
            yield filler
        finally:
            stop.set()
            keeper.join(5)
    finally:
        os.close(fd)
        filler.unlink()
