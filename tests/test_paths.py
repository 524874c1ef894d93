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

GETFLAGS, SETFLAGS, TOPDIR, NOATIME = 0x80086601, 0x40086602, 0x00020000, 0x00000080


def flags_of(path: Path) -> int | None:
    """The directory's inode flags, None where the filesystem has none."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return struct.unpack_from("i", fcntl.ioctl(fd, GETFLAGS, bytes(8)))[0]
    except OSError:
        return None
    finally:
        os.close(fd)


def takes_the_flag(directory: Path) -> bool:
    """Does this filesystem take FS_TOPDIR_FL (ext4 does; tmpfs has flags but refuses it)?"""
    probe = directory / "probe"
    probe.mkdir()
    fd = os.open(probe, os.O_RDONLY | os.O_DIRECTORY)
    try:
        flags = flags_of(probe)
        if flags is None:
            return False
        fcntl.ioctl(fd, SETFLAGS, struct.pack("i4x", flags | TOPDIR))
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
        probe.rmdir()


@pytest.mark.timeout(30)
def test_turns_is_marked_the_top_of_a_hierarchy_and_its_other_flags_stay(state_dir):
    if not takes_the_flag(state_dir):
        pytest.skip(f"the filesystem of {state_dir} does not take FS_TOPDIR_FL")
    paths = StatePaths(state_dir / "s")
    paths.ensure()
    assert flags_of(paths.turns) & TOPDIR  # what `lsattr -d` shows as T
    if shutil.which("chattr") is None:
        return
    subprocess.run(["chattr", "-T", "+A", str(paths.turns)], check=True)  # as a person might
    paths.ensure()  # every start marks it again, keeping what else is set
    assert flags_of(paths.turns) & (TOPDIR | NOATIME) == TOPDIR | NOATIME


@pytest.mark.timeout(30)
def test_a_filesystem_without_the_flag_changes_nothing():
    with tempfile.TemporaryDirectory(dir="/dev/shm") as shm:  # tmpfs: no FS_TOPDIR_FL
        if takes_the_flag(Path(shm)):
            pytest.skip("this tmpfs takes FS_TOPDIR_FL")
        paths = StatePaths(Path(shm) / "s")
        paths.ensure()  # no error: the start goes on
        assert paths.turns.is_dir()
        assert mark_top_directory(paths.turns) is False
        assert mark_top_directory(Path(shm) / "missing") is False
