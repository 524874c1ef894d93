"""A key's provider windows: how much of each usage window is used and when it resets. Pure: no I/O,
no clock (the caller passes `now`, epoch seconds).

A cap key is a provider account; the provider counts its use in windows (Claude's 5-hour and
7-day windows, Codex's primary and secondary, a daily quota). A window is `{window, used,
resets_at, source, seen_at}`: `window` a name (`5h`, `7d`, `day`, `week`, `Nm|Nh|Nd|Nw`, or
`limit` for a usage limit whose window the signal does not name), `used` a fraction 0-1,
`resets_at` epoch seconds, `source` the reader or teller (`codex-session`, `claude-stream`,
`claude-statusline`, `stderr`, `stdout`, `bus`, `cli`, `cluster`), `seen_at` when it was read.

Design note. The book keeps the latest reading of each (key, window): a newer reading of the same
window replaces the older one whatever it says (a window that went down after its reset is news,
not noise). A key is *held* (`holding`) while any of its windows is at or past `hold_at`; it is
held until the latest reset among those windows. A window past its reset is forgotten
(`expire`), and so frees the key at that reset even when nothing says anything new. A reading is
checked whole before anything changes (`check_reading`): a reset in the past, a reset further
ahead than the window's own length (`limit`: 7 days), `used` outside 0-1, or a window name that
is not one: ReadingError naming the field and the value.

A request on the bus is idempotent by its id: the answer given to an id is remembered
(`ID_MEMORY` seconds) and given again without changing anything.

State: `to_json()` / `from_json()` carry the windows and the remembered ids across a restart
(supervisor.admission.state keeps them in admission.json). A window whose reset passed while the
supervisor was down is not restored; an entry that cannot be read (or one from a newer ccsup
with fields it does not know the type of) is skipped and reported, never guessed.

Knows keys, windows and times; nothing of queues, slots, files or sockets.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TypedDict

ID_MEMORY = 600.0  # seconds a request.quota id is remembered (as pause ids are)
DEFAULT_HOLD_AT = 0.95  # [quota] hold_at
MAX_WINDOWS_PER_KEY = 16  # a sidecar inventing window names cannot grow a key without end

SOURCES = (
    "codex-session",
    "claude-stream",
    "claude-statusline",
    "opencode-json",
    "stdout",
    "stderr",
    "bus",
    "cli",
    "cluster",
)

_NAMED = {"day": 86400.0, "week": 604800.0, "limit": 604800.0}
_UNITS = {"m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_LENGTH = re.compile(r"([1-9][0-9]{0,5})([mhdw])\Z")


class ReadingError(ValueError):
    """A reading that cannot be taken; the message names the field and the value."""


class WindowJSON(TypedDict):
    window: str
    used: float
    resets_at: float
    source: str
    seen_at: float


@dataclass(frozen=True)
class Window:
    window: str
    used: float  # 0-1
    resets_at: float  # epoch seconds
    source: str
    seen_at: float

    def to_json(self) -> WindowJSON:
        return {
            "window": self.window,
            "used": self.used,
            "resets_at": self.resets_at,
            "source": self.source,
            "seen_at": self.seen_at,
        }


def window_length(name: object) -> float:
    """Seconds of a window name ("5h" -> 18000, "7d", "day", "limit"), else ReadingError."""
    if not isinstance(name, str):
        raise ReadingError(f'\'window\' must be a name like "5h" or "7d", not {name!r}')
    if name in _NAMED:
        return _NAMED[name]
    match = _LENGTH.match(name)
    if match is None:
        raise ReadingError(
            f'\'window\' {name[:40]!r} is not a window: write it like "5h", "7d", "90m",'
            ' "day", "week" or "limit"'
        )
    return int(match.group(1)) * _UNITS[match.group(2)]


def window_name(minutes: float) -> str:
    """The name of a window given in minutes (Codex's `window_minutes`): 300 -> "5h"."""
    whole = int(round(minutes))
    for unit, seconds in (("d", 86400), ("h", 3600)):
        if whole * 60 % seconds == 0:
            return f"{whole * 60 // seconds}{unit}"
    return f"{max(whole, 1)}m"


def check_reading(
    window: object, used: object, resets_at: object, now: float
) -> tuple[str, float, float]:
    """(window, used, resets_at) when they make a reading at `now`, else ReadingError."""
    length = window_length(window)
    assert isinstance(window, str)
    if isinstance(used, bool) or not isinstance(used, (int, float)) or not math.isfinite(used):
        raise ReadingError(f"'used' must be a fraction from 0 to 1, not {used!r}")
    if not 0.0 <= used <= 1.0:
        raise ReadingError(f"'used' must be a fraction from 0 to 1, not {used!r}")
    if (
        isinstance(resets_at, bool)
        or not isinstance(resets_at, (int, float))
        or not math.isfinite(resets_at)
    ):
        raise ReadingError(f"'resets_at' must be a time in epoch seconds, not {resets_at!r}")
    if resets_at <= now:
        raise ReadingError(
            f"'resets_at' {resets_at:.0f} is in the past (now is {now:.0f}): the window has reset"
        )
    if resets_at > now + length:
        raise ReadingError(
            f"'resets_at' {resets_at:.0f} is {resets_at - now:.0f}s ahead, more than the"
            f" {window} window's own length ({length:.0f}s)"
        )
    return window, float(used), float(resets_at)


@dataclass(frozen=True)
class QuotaAnswer:
    """What a reading or a clear changed: the key's windows after it."""

    key: str
    windows: list[Window]
    changed: bool
    repeat: bool = False  # a request id already answered


class QuotaBook:
    def __init__(self) -> None:
        self._windows: dict[str, dict[str, Window]] = {}
        self._answers: dict[str, tuple[float, str]] = {}  # request id -> (answered at, key)
        self.skipped = 0  # readings refused (bad input of a reader, a sidecar or a person)

    def record(
        self,
        key: str,
        window: object,
        used: object,
        resets_at: object,
        now: float,
        *,
        source: str,
        request_id: str | None = None,
    ) -> QuotaAnswer:
        """Take a reading (checked whole first: ReadingError changes nothing)."""
        if request_id is not None and request_id in self._answers:
            answered_key = self._answers[request_id][1]
            return QuotaAnswer(answered_key, self.windows(answered_key, now), False, repeat=True)
        name, fraction, reset = check_reading(window, used, resets_at, now)
        windows = self._windows.setdefault(key, {})
        if name not in windows and len(windows) >= MAX_WINDOWS_PER_KEY:
            raise ReadingError(
                f"'window' {name!r}: key {key} has {MAX_WINDOWS_PER_KEY} windows already"
            )
        new = Window(name, fraction, reset, source, now)
        old = windows.get(name)
        windows[name] = new
        if request_id is not None:
            self._answers[request_id] = (now, key)
        changed = old is None or (old.used, old.resets_at) != (new.used, new.resets_at)
        return QuotaAnswer(key, self.windows(key, now), changed)

    def merge(self, key: str, window: Window, now: float) -> bool:
        """Take a window read elsewhere (another machine), if it is newer than ours and not
        reset; True when it changed something. Never raises: a bad one is skipped."""
        try:
            check_reading(window.window, window.used, window.resets_at, min(now, window.seen_at))
        except ReadingError:
            self.skipped += 1
            return False
        if window.resets_at <= now:
            return False
        windows = self._windows.setdefault(key, {})
        old = windows.get(window.window)
        if old is not None and old.seen_at >= window.seen_at:
            return False
        windows[window.window] = window
        return old is None or (old.used, old.resets_at) != (window.used, window.resets_at)

    def clear(self, key: str, window: str | None = None) -> list[Window]:
        """Forget the key's windows (or the one named); returns those forgotten."""
        windows = self._windows.get(key, {})
        names = [window] if window is not None else list(windows)
        gone = [windows.pop(n) for n in names if n in windows]
        if not windows:
            self._windows.pop(key, None)
        return gone

    def windows(self, key: str, now: float) -> list[Window]:
        """The key's windows not yet reset at `now`, by name."""
        live = (w for w in self._windows.get(key, {}).values() if w.resets_at > now)
        return sorted(live, key=lambda w: w.window)

    def holding(self, key: str, now: float, hold_at: float) -> Window | None:
        """The window that holds `key` longest at `now` (used >= hold_at), or None: room."""
        over = [w for w in self.windows(key, now) if w.used >= hold_at]
        return max(over, key=lambda w: w.resets_at) if over else None

    def keys(self, now: float) -> list[str]:
        return sorted(k for k in self._windows if self.windows(k, now))

    def all(self, now: float) -> dict[str, list[Window]]:
        return {key: self.windows(key, now) for key in self.keys(now)}

    def next_reset(self) -> float | None:
        return min(
            (w.resets_at for ws in self._windows.values() for w in ws.values()), default=None
        )

    def expire(self, now: float) -> list[tuple[str, Window]]:
        """Forget and return the windows reset by `now`; forget old request ids."""
        gone = []
        for key in list(self._windows):
            for name, w in list(self._windows[key].items()):
                if w.resets_at <= now:
                    gone.append((key, self._windows[key].pop(name)))
            if not self._windows[key]:
                del self._windows[key]
        for request_id, (at, _) in list(self._answers.items()):
            if now - at > ID_MEMORY:
                del self._answers[request_id]
        return gone

    # -- across restarts ---------------------------------------------------------------------

    def to_json(self) -> dict:
        return {
            "windows": {k: [w.to_json() for w in ws.values()] for k, ws in self._windows.items()},
            "ids": {i: [at, key] for i, (at, key) in self._answers.items()},
        }

    def from_json(self, data: object, now: float) -> list[str]:
        """Restore what `to_json` wrote; returns the problems found (entries skipped)."""
        if not isinstance(data, dict):
            return [f"quota: expected an object, not {type(data).__name__}"]
        problems: list[str] = []
        windows = data.get("windows") or {}
        if not isinstance(windows, dict):
            return [f"quota windows: expected an object, not {type(windows).__name__}"]
        for key, entries in windows.items():
            for entry in entries if isinstance(entries, list) else [entries]:
                window = window_from_json(entry)
                if window is None:
                    problems.append(
                        f"quota window of {str(key)[:64]} {str(entry)[:200]} is malformed"
                    )
                elif window.resets_at > now:  # one that reset while we were down stays reset
                    self._windows.setdefault(str(key), {})[window.window] = window
        ids = data.get("ids") or {}
        if isinstance(ids, dict):
            for request_id, value in ids.items():
                if (
                    isinstance(value, list)
                    and len(value) == 2
                    and _number(value[0])
                    and isinstance(value[1], str)
                ):
                    if now - float(value[0]) <= ID_MEMORY:
                        self._answers[str(request_id)] = (float(value[0]), value[1])
                else:
                    problems.append(f"quota request id {str(request_id)[:64]!r} is malformed")
        return problems


def window_from_json(entry: object) -> Window | None:
    """A Window from its JSON (a file, etcd), or None when it cannot be one."""
    if not isinstance(entry, dict):
        return None
    name, used, resets_at = entry.get("window"), entry.get("used"), entry.get("resets_at")
    source, seen_at = entry.get("source"), entry.get("seen_at")
    if not isinstance(name, str) or not isinstance(source, str):
        return None
    if not (_number(used) and _number(resets_at) and _number(seen_at)):
        return None
    try:
        window_length(name)
    except ReadingError:
        return None
    if not 0.0 <= float(used) <= 1.0:  # type: ignore[arg-type]
        return None
    return Window(name, float(used), float(resets_at), source, float(seen_at))  # type: ignore[arg-type]


def describe(window: Window, clock: str) -> str:
    """`5h window 97% used, resets at 15:00:05` (`clock`: the reset as the reader's clock)."""
    return f"{window.window} window {window.used * 100:.0f}% used, resets at {clock}"


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
