"""`[quota]`: when a key's provider window holds its grants, and which harnesses' own signals are
read (supervisor.admission.quota keeps the windows; supervisor.admission.quota_readers and quota_signals read the signals).

```toml
[quota]
hold_at = 0.95                          # a window at or past this fraction holds the key
read = ["codex", "claude", "opencode"]  # whose own signals are read (default: every one)
```
Pure: checks what the config's checker hands it.
"""

from __future__ import annotations

import math

from ..errors import ConfigError
from .schema import Checker, Key, Section, Table

READERS = ("codex", "claude", "opencode")  # the harnesses whose signals ccsup can read
DEFAULT_HOLD_AT = 0.95

SECTION = Section(
    ("quota",),
    "Provider usage windows (ccsup quota). A key with a window at or past `hold_at` (or one\n"
    "the provider rejected) grants nothing until that window resets; running turns go on.",
    (
        Key(
            "hold_at",
            DEFAULT_HOLD_AT,
            "The used fraction (0 to 1) of any window of a key at which its grants are held.",
        ),
        Key(
            "read",
            list(READERS),
            "Whose own signals are read for the keys of that harness: codex (session files),\n"
            "claude (stream-json rate_limit_event, limit messages), opencode (JSON errors).",
        ),
    ),
)


def _hold_at(value: object, *, where: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not 0 < value <= 1
    ):
        raise ConfigError(f"{where}: must be a fraction more than 0 and at most 1, not {value!r}")
    return float(value)


def _read(value: object, *, where: str) -> frozenset[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: must be a list of harness names, not {value!r}")
    for name in value:
        if name not in READERS:
            raise ConfigError(
                f"{where}: {name!r} is not a harness whose signals ccsup reads"
                f" ({', '.join(READERS)})"
            )
    return frozenset(value)


def parse_quota(c: Checker, top: Table) -> tuple[float, frozenset[str]]:
    """(hold_at, read) of `[quota]`; the defaults where a value is absent or wrong (reported)."""
    table = c.table(top, ("quota",))
    hold_at = c.run(("quota", "hold_at"), _hold_at, table.get("hold_at", DEFAULT_HOLD_AT))
    read = c.run(("quota", "read"), _read, table.get("read", list(READERS)))
    return (
        DEFAULT_HOLD_AT if hold_at is None else hold_at,
        frozenset(READERS) if read is None else read,
    )
