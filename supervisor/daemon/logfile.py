"""The supervisor's own log: `<state>/ccsup.log`, 0600 (it names turns, keys and holders), rotated
at 5 MiB with three old files kept; stderr instead with --foreground. State: the files; one an
older ccsup left wider is narrowed when it is opened."""

from __future__ import annotations

import logging
import logging.handlers
import os
import sys

from ..paths import StatePaths


def _private(path: str, flags: int) -> int:
    """open()'s opener for the log: made 0600 whatever the umask, and narrowed if an older ccsup
    left it wider (it names turns, keys and holders)."""
    fd = os.open(path, flags | os.O_CLOEXEC, 0o600)
    os.fchmod(fd, 0o600)
    return fd


class _PrivateLog(logging.handlers.RotatingFileHandler):
    """`<state>/ccsup.log`, 0600 (and each file a rotation starts)."""

    def _open(self):
        return open(  # noqa: SIM115 -- the handler keeps it open, as logging's own _open does
            self.baseFilename,
            self.mode,
            encoding=self.encoding,
            errors=self.errors,
            opener=_private,
        )


def setup_logging(paths: StatePaths, foreground: bool) -> None:
    if foreground:
        handler: logging.Handler = logging.StreamHandler(sys.stderr)
    else:
        handler = _PrivateLog(paths.log, maxBytes=5 << 20, backupCount=3)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("ccsup")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
