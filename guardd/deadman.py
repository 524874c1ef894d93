"""The dead-man deadline file: a time after which a guard ends its turn on its own.

Whoever started the guard (the supervisor, for a turn whose capacity is leased from elsewhere)
writes `{"v":1, "stop_at": S, "kill_at": K}` and keeps pushing both forward while it may. The
guard (`--deadline-file F`) reads it when S comes: when S has not moved, it begins its stop
(SIGTERM, the grace, SIGKILL); past K it kills at once, without a grace. Both are seconds on
CLOCK_BOOTTIME, which keeps counting while the machine is suspended: a deadline is a point in the
world's time, not in this machine's running time.

Why a file: a frozen (SIGSTOP) or dead writer cannot push a file, and the guard needs no channel,
library or connection to notice that. One file may serve every guard of a writer. The guard
knows nothing of why the deadline exists.

State: written atomically (guardd.record.write_json). A missing, unreadable, corrupt or
newer-version file reads as a deadline already past (the safe side: the work ends). A writer that
restarts writes it anew before it starts any guard that reads it.
"""

from __future__ import annotations

import os
import time

from guardd import record


def boottime() -> float:
    """Seconds on CLOCK_BOOTTIME (counts suspend)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def write_deadline(path: str | os.PathLike, stop_at: float, kill_at: float) -> None:
    record.write_json(path, {"v": 1, "stop_at": stop_at, "kill_at": kill_at}, mode=0o644)


def read_deadline(path: str | os.PathLike) -> tuple[float, float, str | None]:
    """(stop_at, kill_at, why it reads as past or None). Never raises: see the module docstring."""
    try:
        data = record.read_json(path)
    except FileNotFoundError:
        return 0.0, 0.0, f"deadline file {os.fspath(path)} is missing"
    except record.RecordError as e:
        return 0.0, 0.0, str(e)
    stop_at, kill_at = data.get("stop_at"), data.get("kill_at")
    for value in (stop_at, kill_at):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return 0.0, 0.0, f"deadline file {os.fspath(path)} has no numbers stop_at, kill_at"
    return float(stop_at), float(kill_at), None  # type: ignore[arg-type]
