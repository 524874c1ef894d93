"""What `ps` and `status` print about admission: paused and rate-held keys, and why a waiter
waits (supervisor.admission.control's views). Pure."""

from __future__ import annotations

import datetime as dt
import time


def clock_time(epoch: float | None) -> str:
    """A local wall-clock time, to the second; '-' when unknown."""
    if epoch is None:
        return "-"
    return dt.datetime.fromtimestamp(epoch).isoformat(sep=" ", timespec="seconds")


def _in(epoch: float | None, now: float) -> str:
    if epoch is None:
        return ""
    left = max(epoch - now, 0.0)
    return f" (in {left:.0f}s)" if left < 120 else f" (in {left / 60:.0f}m)"


def format_keys(result: dict, now: float | None = None) -> list[str]:
    """The lines about paused and rate-held keys (for ps and status); none when there are none."""
    now = time.time() if now is None else now
    lines = []
    for entry in result.get("keys") or []:
        pause, next_grant = entry.get("paused"), entry.get("next_grant")
        if pause:
            why = f": {pause['reason']}" if pause.get("reason") else ""
            by = f" by {pause['by']}" if pause.get("by") else ""
            lines.append(
                f"{entry['key']} paused until {clock_time(pause['until'])}"
                f"{_in(pause['until'], now)}{by}{why}"
            )
        if next_grant:
            lines.append(
                f"{entry['key']} next grant at {clock_time(next_grant)}{_in(next_grant, now)} (rate)"
            )
    return lines


def format_why(why: dict | None, now: float) -> str:
    """One waiter's reason, as the WHY column of ps shows it."""
    if not why:
        return "-"
    until = f" until {clock_time(why['until'])}" if why.get("until") else ""
    return f"{why['reason']}{until}"
