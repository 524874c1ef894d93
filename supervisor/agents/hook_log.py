"""The hook's log ($CCSUP_HOOK_LOG, else $XDG_STATE_HOME/ccsup/hook.log): why a command passed
untouched, said once per line, appended and never read back. Its own module so that the hook's
fast path (supervisor.agents.hook) and its slow path (supervisor.agents.route) share it without
importing each other. Standard library only.

State: appended; a missing folder is made 0700 (it is the state directory, which a supervisor
refuses when others may enter it), the file 0600; a write that fails is dropped (nowhere to say
it; the command still runs).
"""

from __future__ import annotations

import os


def log_path() -> str:
    if os.environ.get("CCSUP_HOOK_LOG"):
        return os.environ["CCSUP_HOOK_LOG"]
    base = os.environ.get("XDG_STATE_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "ccsup", "hook.log")


def log(message: str) -> None:
    import time

    path = log_path()
    try:
        # Private as the state directory must be (a supervisor refuses one others may enter):
        # the hook may be the first to make it.
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        with open(fd, "a", encoding="utf-8", errors="replace") as f:
            f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} ccsup hook[{os.getpid()}]: {message}\n")
    except OSError:
        pass  # nowhere to say it; the command still runs
