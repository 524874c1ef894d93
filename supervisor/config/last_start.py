"""How the last supervisor on a state directory was started (`<state>/last-start.json`): the
config file it read (None: the embedded defaults) and its `--caps`, so that `ccsup restart`
starts the next one the same way and, once none runs, the advice `start one with ...` gives the
same command back (after a SIGKILL, a bare `ccsup start` would lose `--caps`).

Written by the supervisor once it holds the state directory's lock (atomically: temp file,
fsync, rename), read by anyone without a lock. State question. Runs again: rewritten whole at
each start. Stops half-way: the old file or the new one, never a mix. Missing, empty, corrupt,
or of a newer version (`v` > 1): read as unknown (None), and the advice is the plain
`ccsup start`. Restart: the file is the last start's, whoever stopped it and how.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import TypedDict

from guardd.record import write_json

FILE_NAME = "last-start.json"
VERSION = 1


class LastStart(TypedDict):
    config: str | None  # the config file's absolute path; None for the embedded defaults
    caps: dict[str, int]  # --caps


def record(state_dir: Path, config: str | None, caps: dict[str, int]) -> None:
    """Write how this supervisor was started; OSError to the caller (it logs and goes on)."""
    write_json(Path(state_dir) / FILE_NAME, {"v": VERSION, "config": config, "caps": caps})


def read(state_dir: Path) -> LastStart | None:
    try:
        data = json.loads((Path(state_dir) / FILE_NAME).read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("v") != VERSION:
        return None
    config, caps = data.get("config"), data.get("caps")
    if config is not None and not isinstance(config, str):
        return None
    if not isinstance(caps, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
        for k, v in caps.items()
    ):
        return None
    return LastStart(config=config, caps=caps)


def _found_now() -> str | None:
    """The config file a plain `ccsup start` here would read ($CCSUP_CONFIG, the XDG file)."""
    import os

    from .files import find_config_path

    found = find_config_path(None, os.environ)
    return None if found is None else os.path.abspath(found)


def start_command(state_dir: Path) -> str:
    """`ccsup start` as the last supervisor on state_dir was started: its --caps, and its config
    file when a plain start would not find that one; plain `ccsup start` when not known."""
    last = read(state_dir)
    words = ["ccsup", "start"]
    if last is not None:
        if last["config"] is not None and last["config"] != _found_now():
            words += ["--config", last["config"]]
        if last["caps"]:
            words += ["--caps", ",".join(f"{k}={v}" for k, v in last["caps"].items())]
    return shlex.join(words)
