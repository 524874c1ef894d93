"""The top level of the file: its header comment and `state_dir`."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from .schema import Checker, Key, Section, Table
from .values import expand_home, string

SECTION = Section(
    (),
    'ccsup configuration. Durations are strings such as "5s", "500ms", "2m"; sizes such\n'
    'as "2GiB", "512MiB" (K/M/G/T and KiB/MiB/... are powers of 1024, kB/MB/GB are SI).\n'
    "Check a file with `ccsup config check [--config FILE]`. A commented-out `# key = value`\n"
    "line shows an optional key with an example value: remove the '# ' to use it.\n",
    (
        Key(
            "state_dir",
            "~/.local/state/ccsup",
            "Where slots, records, logs and sockets live (default: $XDG_STATE_HOME/ccsup, else\n"
            "~/.local/state/ccsup). --state-dir and $CCSUP_STATE_DIR win over this.",
            example=True,
        ),
    ),
)


def parse_state_dir(c: Checker, top: Table, env: Mapping[str, str]) -> Path | None:
    """`state_dir` (~ expanded), or None when the file does not set it."""
    if "state_dir" not in top:
        return None
    value = c.run(("state_dir",), string, top["state_dir"])
    if value is None:
        return None
    path = expand_home(value, env)
    if not path.is_absolute():
        c.add(("state_dir",), f"must be an absolute path or start with ~/, not {value!r}")
        return None
    return path
