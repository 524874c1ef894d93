"""A turn's containment as the supervisor sees it, off the event loop: guard records read in a
worker thread, and the turn's cgroup (where a writable cgroup2 hierarchy is in use).

Design note. A big turn's guard record holds hundreds of groups (a few ms to parse), and its
cgroup's checks are file reads; neither belongs on the event loop when it grows with the turn, so
the blocking functions here are called through asyncio.to_thread by supervisor.endings and
supervisor.gone. They only read (or, for a cgroup, kill and remove what is confirmed gone), so
running one twice, or abandoning it half-way, is harmless.

Knows guard records (guardd.record) and cgroups (guardd.cgroup); nothing of slots or the bus.
Holds no state.
"""

from __future__ import annotations

import os
from typing import Any

from guardd.record import RecordError, read_json


def read_record(record_path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """Blocking: a guard record, None when it cannot be read (not written yet, or being replaced:
    the next look finds it)."""
    try:
        return read_json(record_path)
    except (OSError, RecordError):
        return None
