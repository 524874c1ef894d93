"""admission.json: the pauses, the start-rate windows and the keys' provider windows, kept across
a supervisor restart.

`{"v":1, "saved_at", "pauses": {"pauses":[...], "ids":{...}}, "starts": {key: [epoch, ...]},
"quota": {"windows": {key: [{window, used, resets_at, source, seen_at}, ...]}, "ids": {...}}}`,
written whole (it is small: one entry per paused key, at most N times per rate-limited key, at
most 16 windows per key) by guardd.record.write_json at every change: a new or ended pause, a
grant of a rate-limited key, a new, changed, cleared or reset window. A file without "quota"
(written before windows were kept) reads as no window.

The state question:
- Runs again / restarts: `load` gives back what the last `save` wrote; supervisor.admission.pauses and
  supervisor.admission.rates take it back, dropping a pause that ended meanwhile and grant times that left
  their window (so an ended pause never comes back, and the current window's grants still count).
- Stops half-way: the write is an atomic replace; the old file or the new one, never a mix. Its
  fsync is done soon after by the file worker's thread (supervisor.filework), not on the event
  loop (a rate-limited grant writes this file): a SIGKILL loses nothing written; a power loss in
  between can leave an empty or old file, which is read as below.
- Missing: nothing was paused. Empty, corrupt, not an object, or a newer version: moved aside to
  `admission.json.bad-<epoch>` (nothing deleted); `load` says why, for an error event and a log
  line; the supervisor starts with no pause and empty windows.
Knows the file; nothing of what a pause means.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TypedDict

from guardd.record import RecordError, read_json, write_json

ADMISSION_VERSION = 1
FILE_NAME = "admission.json"


class AdmissionFile(TypedDict):
    pauses: dict
    starts: dict
    quota: dict


def path_in(state_dir: Path) -> Path:
    return Path(state_dir) / FILE_NAME


def save(
    path: Path, *, pauses: dict, starts: dict, quota: dict | None = None, sync: bool = True
) -> None:
    """Write the file atomically; `sync=False` leaves its fsync to the caller (a file worker)."""
    write_json(
        path,
        {
            "v": ADMISSION_VERSION,
            "saved_at": time.time(),
            "pauses": pauses,
            "starts": starts,
            "quota": quota or {},
        },
        mode=0o600,
        sync=sync,
    )


def load(path: Path) -> tuple[AdmissionFile, str | None]:
    """(contents, problem). A bad file is moved aside and reported; contents are then empty."""
    empty: AdmissionFile = {"pauses": {}, "starts": {}, "quota": {}}
    try:
        data = read_json(path, max_version=ADMISSION_VERSION)
        for name in ("pauses", "starts", "quota"):
            if not isinstance(data.get(name, {}), dict):
                raise RecordError(f"{path}: '{name}' is not an object")
    except FileNotFoundError:
        return empty, None
    except RecordError as e:
        aside = path.with_name(f"{path.name}.bad-{int(time.time())}")
        try:
            os.replace(path, aside)
        except OSError as move_error:
            return empty, f"{e}; unable to move it aside: {move_error.strerror}"
        return empty, f"{e}; moved aside to {aside}"
    return {
        "pauses": data.get("pauses", {}),
        "starts": data.get("starts", {}),
        "quota": data.get("quota", {}),
    }, None
