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
        for window in entry.get("quota") or []:
            lines.append(f"{entry['key']} quota {format_window(window, now)}")
    return lines


def format_window(window: dict, now: float) -> str:
    """`5h 97% used, resets at 2026-12-07 15:00:05 (in 2m), from codex-session`."""
    return (
        f"{window['window']} {window['used'] * 100:.0f}% used, resets at"
        f" {clock_time(window['resets_at'])}{_in(window['resets_at'], now)},"
        f" from {window['source']}"
    )


def format_why(why: dict | None, now: float) -> str:
    """One waiter's reason, as the WHY column of ps shows it."""
    if not why:
        return "-"
    until = f" until {clock_time(why['until'])}" if why.get("until") else ""
    if why["reason"] == "quota" and isinstance(why.get("detail"), str):
        # "quota: 5h window 97% used, resets at 15:00:05": the window and its use
        window = why["detail"].removeprefix("quota: ").partition(", resets")[0]
        return f"quota ({window}){until}"
    return f"{why['reason']}{until}"


def format_in_force(result: dict) -> list[str]:
    """`status`'s lines on what is in force: each known key's cap and its source (the config
    file, --caps, a harness's default_cap, the default; a cluster cap beside it), the rates and
    max_pause."""
    from .formats import format_age

    lines = []
    for entry in result.get("caps_in_force") or []:
        origin = entry.get("from")
        source = entry["source"]
        if source == "harness default" or (origin not in (None, entry["key"], "default_cap")):
            source += f": {origin}"
        cluster = f", cluster cap {entry['cluster_cap']}" if "cluster_cap" in entry else ""
        lines.append(f"cap     {entry['key']} = {entry['cap']} ({source}{cluster})")
    for name, members in (result.get("pools") or {}).items():
        lines.append(f"pool    {name} = {', '.join(members)}")
    if "default_cap" in result and "caps_in_force" in result:
        lines.append(f"cap     any other key = {result['default_cap']} (default_cap)")
    for key, rate in sorted((result.get("rates") or {}).items()):
        lines.append(f"rate    {key} = {rate}")
    if result.get("max_pause") is not None:
        lines.append(f"pauses  at most {format_age(result['max_pause'])} ([slots] max_pause)")
    return lines


def known_key(key: str, result: dict) -> bool:
    """Whether `status` knows `key`: configured, ever run here (slot files), waiting, or a bare
    harness name of such a key or with a [harness.X] default_cap."""
    known = {e["key"] for e in result.get("caps_in_force") or []}
    known |= {str(k) for k in result.get("caps") or {}}
    known |= set(result.get("pools") or {})
    harnesses = {k.partition(":")[0] for k in known} | set(result.get("harness_default_caps") or {})
    return key in known or (":" not in key and key in harnesses)
