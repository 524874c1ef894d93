"""The state directory's tree: `turns/` marked the top of a directory hierarchy (ext4's
FS_TOPDIR_FL) where the filesystem has such flags, and nothing refused where it has not."""

from __future__ import annotations

import fcntl
import os
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path

import pytest

from supervisor.paths import StatePaths, mark_top_directory

GETFLAGS, TOPDIR, NOATIME = 0x80086601, 0x00020000, 0x00000080


def flags_of(path: Path) -> int | None:
    """The directory's inode flags, None where the filesystem has none."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return struct.unpack_from("i", fcntl.ioctl(fd, GETFLAGS, bytes(8)))[0]
    except OSError:
        return None
    finally:
        os.close(fd)


@pytest.mark.timeout(30)
def test_turns_is_marked_the_top_of_a_hierarchy_and_its_other_flags_stay(state_dir):
    paths = StatePaths(state_dir / "s")
    paths.ensure()
    if flags_of(paths.turns) is None:
        pytest.skip(f"{paths.turns}'s filesystem has no inode flags")
    assert flags_of(paths.turns) & TOPDIR  # what `lsattr -d` shows as T
    if shutil.which("chattr") is None:
        return
    subprocess.run(["chattr", "-T", "+A", str(paths.turns)], check=True)  # as a person might
    paths.ensure()  # every start marks it again, keeping what else is set
    assert flags_of(paths.turns) & (TOPDIR | NOATIME) == TOPDIR | NOATIME


@pytest.mark.timeout(30)
def test_a_filesystem_without_the_flag_changes_nothing():
    with tempfile.TemporaryDirectory(dir="/dev/shm") as shm:  # tmpfs: no FS_TOPDIR_FL
        paths = StatePaths(Path(shm) / "s")
        paths.ensure()
        assert paths.turns.is_dir()
        assert mark_top_directory(paths.turns) is False or flags_of(paths.turns) is not None
        assert mark_top_directory(Path(shm) / "missing") is False
