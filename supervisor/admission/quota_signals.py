"""The harnesses' own quota signals, parsed: one small pure function per signal, each taking the
exact bytes the pinned harness writes and giving the readings in them (`Reading`: window, used
0-1, resets_at epoch seconds, source). No I/O; the clock and the time zone are arguments.

What each pinned harness writes (docs/admission.md, "What each pinned harness gives"):
- Codex 0.171.0, its session file `$CODEX_HOME/sessions/YYYY/MM/DD/rollout-*.jsonl`:
  `{"type":"event_msg","payload":{"type":"token_count",...,"rate_limits":{"primary":
  {"used_percent":42.5,"window_minutes":300,"resets_at":T},"secondary":{...}}}}` (percent 0-100).
  `codex_session_line`.
- Claude Code 2.1.332, `-p --output-format stream-json --verbose` stdout: `{"type":
  "rate_limit_event","rate_limit_info":{"status":"allowed|allowed_warning|rejected","resetsAt":T,
  "rateLimitType":"five_hour","unifiedWindows":{"five_hour":{"utilization":0.42,"resetsAt":T,
  "status":...},"seven_day":{...}}}}` (utilization 0-1); the same `rate_limit_info` in a 429's
  `assistant` line (`api_error_params`). `claude_stream_line`. Its status-line payload
  (interactive only): `"rate_limits":{"five_hour":{"used_percentage":42,"resets_at":T}}`
  (percent). `claude_statusline`.
- OpenCode 1.18.33, `--format json` stdout after its retries: `{"type":"error",...,"error":
  {"data":{"statusCode":429,"responseHeaders":{...verbatim, lower-cased...}}}}`. `opencode_line`:
  `retry-after` / `retry-after-ms`, `anthropic-ratelimit-unified-<w>-utilization|-reset|-status`,
  `x-codex-primary|secondary-used-percent|-window-minutes|-reset-at`, and `x-ratelimit-remaining-*`
  at 0 with its `x-ratelimit-reset-*`.
- The limit messages, text (`limit_text`): Codex `You’ve hit your usage limit. ... try again at
  11:32 AM.` (local time, no zone; `Dec 10th, 2026 10:02 AM` when not today); Claude `You've hit
  your 5-hour limit · resets 11:36am (UTC)` / `weekly limit · resets Dec 9, 5:43pm (UTC)`. A time
  given to the minute is read as the end of that minute (never freeing a key early), in the zone
  the message names, else the machine's (`tz`).

Numbers are read where the harness gives numbers; text only where it gives nothing else.
A line that is not one of these gives no reading; one that is but cannot be read raises
SignalError (the reader counts it and goes on).
"""

from __future__ import annotations

import datetime as dt
import email.utils
import json
import math
import re
from dataclasses import dataclass
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .quota import window_name


class SignalError(ValueError):
    """A payload that is one of the signals but cannot be read (malformed)."""


@dataclass(frozen=True)
class Reading:
    window: str
    used: float
    resets_at: float
    source: str


# Claude's window names (unifiedWindows, rateLimitType, the status line's rate_limits).
CLAUDE_WINDOWS = {"five_hour": "5h", "seven_day": "7d"}
# anthropic-ratelimit-unified-<w>-* header windows.
UNIFIED_HEADER_WINDOWS = {"5h": "5h", "7d": "7d"}


def _num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _json_line(line: bytes) -> dict:
    try:
        data = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        raise SignalError(f"not JSON: {line[:80]!r}") from None
    if not isinstance(data, dict):
        raise SignalError(f"not a JSON object: {line[:80]!r}")
    return data


# -- Codex -------------------------------------------------------------------------------------


def codex_session_line(line: bytes) -> list[Reading]:
    """A line of a Codex session file: the windows of a `token_count` event, else none."""
    if b'"token_count"' not in line or b'"rate_limits"' not in line:
        return []
    data = _json_line(line)
    payload = data.get("payload") if data else None
    if not isinstance(payload, dict) or payload.get("type") != "token_count":
        return []
    limits = payload.get("rate_limits")
    if limits is None:
        return []
    if not isinstance(limits, dict):
        raise SignalError("token_count rate_limits is not an object")
    readings = []
    for slot in ("primary", "secondary"):
        window = limits.get(slot)
        if window is None:
            continue
        if not isinstance(window, dict):
            raise SignalError(f"token_count rate_limits.{slot} is not an object")
        used, minutes, resets = (
            _num(window.get("used_percent")),
            _num(window.get("window_minutes")),
            _num(window.get("resets_at")),
        )
        if used is None or resets is None:
            continue  # Codex writes resets_at null when the provider gave no reset-at
        if minutes is None or minutes <= 0:
            raise SignalError(f"token_count rate_limits.{slot}.window_minutes is {minutes!r}")
        readings.append(Reading(window_name(minutes), used / 100.0, resets, "codex-session"))
    return readings


# -- Claude Code -------------------------------------------------------------------------------


def claude_rate_limit_info(info: object, source: str) -> list[Reading]:
    """The windows of a `rate_limit_info` object (utilization 0-1; rejected: 1)."""
    if not isinstance(info, dict):
        raise SignalError("rate_limit_info is not an object")
    readings: dict[str, Reading] = {}
    windows = info.get("unifiedWindows")
    if isinstance(windows, dict):
        for name, window in windows.items():
            if name not in CLAUDE_WINDOWS or not isinstance(window, dict):
                continue
            reading = _claude_window(CLAUDE_WINDOWS[name], window, source)
            if reading is not None:
                readings[reading.window] = reading
    top = CLAUDE_WINDOWS.get(str(info.get("rateLimitType")))
    if top is not None:
        reading = _claude_window(top, info, source)
        if reading is not None and (top not in readings or info.get("status") == "rejected"):
            readings[top] = reading
    return list(readings.values())


def _claude_window(name: str, window: dict, source: str) -> Reading | None:
    resets = _num(window.get("resetsAt"))
    used = _num(window.get("utilization"))
    if window.get("status") == "rejected":
        used = 1.0
    if resets is None or used is None:
        return None
    return Reading(name, min(max(used, 0.0), 1.0), resets, source)


def claude_stream_line(line: bytes) -> list[Reading]:
    """A line of Claude Code's stream-json output: a `rate_limit_event`, or a 429's `assistant`
    line with `api_error_params.rate_limit_info`; else none."""
    if b"rate_limit_info" not in line:
        return []
    data = _json_line(line)
    if data is None:
        return []
    if data.get("type") == "rate_limit_event":
        return claude_rate_limit_info(data.get("rate_limit_info"), "claude-stream")
    if data.get("type") == "assistant":
        params = data.get("api_error_params")
        if isinstance(params, dict) and "rate_limit_info" in params:
            return claude_rate_limit_info(params["rate_limit_info"], "claude-stream")
    return []


def claude_statusline(payload: bytes) -> list[Reading]:
    """The JSON an interactive Claude Code hands its status-line command: its `rate_limits`."""
    data = _json_line(payload)
    limits = data.get("rate_limits") if data else None
    if limits is None:
        return []
    if not isinstance(limits, dict):
        raise SignalError("rate_limits is not an object")
    readings = []
    for name, window in limits.items():
        if name not in CLAUDE_WINDOWS:
            continue
        if not isinstance(window, dict):
            raise SignalError(f"rate_limits.{name} is not an object")
        used, resets = _num(window.get("used_percentage")), _num(window.get("resets_at"))
        if used is None or resets is None:
            raise SignalError(f"rate_limits.{name} has no used_percentage or resets_at")
        readings.append(
            Reading(CLAUDE_WINDOWS[name], min(used / 100.0, 1.0), resets, "claude-statusline")
        )
    return readings


# -- OpenCode ----------------------------------------------------------------------------------


def opencode_line(line: bytes, now: float) -> list[Reading]:
    """OpenCode's `--format json` error line: what the 429's response headers say."""
    if b"responseHeaders" not in line:
        return []
    data = _json_line(line)
    if data.get("type") != "error":
        return []
    error = data.get("error")
    info = error.get("data") if isinstance(error, dict) else None
    if not isinstance(info, dict):
        return []
    headers = info.get("responseHeaders")
    if not isinstance(headers, dict):
        raise SignalError("error.data.responseHeaders is not an object")
    status = info.get("statusCode")
    return response_headers({str(k).lower(): str(v) for k, v in headers.items()}, now, status)


def response_headers(headers: dict[str, str], now: float, status: object = 429) -> list[Reading]:
    """The windows a provider's response headers give (lower-cased names)."""
    readings: dict[str, Reading] = {}
    for w, name in UNIFIED_HEADER_WINDOWS.items():
        prefix = f"anthropic-ratelimit-unified-{w}-"
        used = _float(headers.get(prefix + "utilization"))
        resets = _float(headers.get(prefix + "reset"))
        if headers.get(prefix + "status") == "rejected":
            used = 1.0
        if used is not None and resets is not None:
            readings[name] = Reading(name, min(max(used, 0.0), 1.0), resets, "opencode-json")
    for slot in ("primary", "secondary"):
        prefix = f"x-codex-{slot}-"
        used = _float(headers.get(prefix + "used-percent"))
        minutes = _float(headers.get(prefix + "window-minutes"))
        resets = _float(headers.get(prefix + "reset-at"))
        if used is not None and resets is not None and minutes and minutes > 0:
            name = window_name(minutes)
            readings[name] = Reading(name, min(used / 100.0, 1.0), resets, "opencode-json")
    if status == 429:
        wait = _retry_after(headers, now)
        if wait is None:
            for kind in ("requests", "tokens"):
                if headers.get(f"x-ratelimit-remaining-{kind}") == "0":
                    reset = _openai_duration(headers.get(f"x-ratelimit-reset-{kind}"))
                    if reset is not None:
                        wait = max(wait or 0.0, reset)
        if wait is not None and wait > 0 and not readings:
            readings["limit"] = Reading("limit", 1.0, now + wait, "opencode-json")
    return list(readings.values())


def _float(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _retry_after(headers: dict[str, str], now: float) -> float | None:
    ms = _float(headers.get("retry-after-ms"))
    if ms is not None:
        return ms / 1000.0
    text = headers.get("retry-after")
    if text is None:
        return None
    seconds = _float(text)
    if seconds is not None:
        return seconds
    try:
        return email.utils.parsedate_to_datetime(text).timestamp() - now
    except (TypeError, ValueError):
        return None


_DURATION_PART = re.compile(r"([0-9.]+)(ms|s|m|h)")


def _openai_duration(text: str | None) -> float | None:
    """OpenAI's `x-ratelimit-reset-*`: "6m0s", "1s", "20ms"."""
    if not text:
        return None
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    return sum(float(n) * scale[u] for n, u in parts)


# -- limit messages ----------------------------------------------------------------------------

_CODEX_LIMIT = re.compile(
    r"hit your usage limit\..*?try again at (?:(?P<date>[A-Z][a-z]{2} \d{1,2}(?:st|nd|rd|th)?,"
    r" \d{4}) )?(?P<time>\d{1,2}:\d{2} ?[AP]M)"
)
_CLAUDE_LIMIT = re.compile(
    r"hit your (?P<which>5-hour|weekly|session|Opus weekly|Sonnet weekly) limit"
    r" · resets (?:(?P<date>[A-Z][a-z]{2} \d{1,2}), )?(?P<time>\d{1,2}(?::\d{2})?(?:am|pm))"
    r"(?: \((?P<zone>[A-Za-z_/+\-0-9]+)\))?"
)
_CLAUDE_WINDOW = {"5-hour": "5h", "session": "5h", "weekly": "7d"}


def limit_text(line: str, now: float, tz: dt.tzinfo | None = None) -> list[Reading]:
    """A harness's usage-limit message (Codex's or Claude Code's), text: the key is at its limit
    until the time it names. `tz`: the machine's zone (None: the local one)."""
    if "hit your" not in line:
        return []
    found = _CODEX_LIMIT.search(line)
    if found is not None:
        at = _local_time(found.group("date"), found.group("time"), now, tz, codex=True)
        return [Reading("limit", 1.0, at, "stdout")]
    found = _CLAUDE_LIMIT.search(line)
    if found is not None:
        zone: dt.tzinfo | None = tz
        if found.group("zone"):
            try:
                zone = ZoneInfo(found.group("zone"))
            except (ZoneInfoNotFoundError, ValueError):
                raise SignalError(f"unknown time zone {found.group('zone')!r}") from None
        at = _local_time(found.group("date"), found.group("time"), now, zone, codex=False)
        window = _CLAUDE_WINDOW.get(found.group("which"), "7d")
        return [Reading(window, 1.0, at, "stdout")]
    return []


def _local_time(
    date: str | None, clock: str, now: float, tz: dt.tzinfo | None, *, codex: bool
) -> float:
    """The end of the minute named (a date, else the next such time from now) in `tz`."""
    clock = clock.replace(" ", "").upper()
    fmt = "%I:%M%p" if ":" in clock else "%I%p"
    try:
        of_day = dt.datetime.strptime(clock, fmt).time()
    except ValueError:
        raise SignalError(f"not a time: {clock!r}") from None
    here = dt.datetime.fromtimestamp(now, tz) if tz is not None else dt.datetime.fromtimestamp(now)
    if date:
        text = re.sub(r"(\d)(st|nd|rd|th)", r"\1", date)
        try:
            day = (
                dt.datetime.strptime(text, "%b %d, %Y").date()
                if codex
                else dt.datetime.strptime(f"{text} {here.year}", "%b %d %Y").date()
            )
        except ValueError:
            raise SignalError(f"not a date: {date!r}") from None
        when = dt.datetime.combine(day, of_day, tzinfo=here.tzinfo)
        if not codex and when.timestamp() < now - 86400:
            when = when.replace(year=when.year + 1)  # "Jan 2" said on Dec 30
    else:
        when = dt.datetime.combine(here.date(), of_day, tzinfo=here.tzinfo)
        if when.timestamp() + 60 <= now:
            when += dt.timedelta(days=1)
    return when.timestamp() + 60  # the end of the minute named (naive: the machine's zone)
