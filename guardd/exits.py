"""The guard's exit contract: the statuses it exits with, and how CMD's end is told.

    0-255 as CMD exited; 128+N when CMD was killed by signal N; 125 the guard itself failed (a
    usage error, a cgroup it could not make or join, work it could not end); 126 CMD was found but
    could not be executed; 127 CMD was not found.

`Exit` is CMD's end as the guard saw it in one wait status: its `exit_code()` is what the guard
exits with, its `to_json()` the `exit` field of the guard record and of the `exited` hint.

Knows wait statuses and these numbers; nothing of processes, records or the loop. Stateless.
"""

from __future__ import annotations

import os

EXIT_GUARD_FAILURE = 125
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127


class Exit:
    """How CMD ended: an exit code, or the signal that killed it (exactly one is set)."""

    __slots__ = ("code", "signal")

    def __init__(self, code: int | None, signal: int | None):
        self.code, self.signal = code, signal

    @classmethod
    def from_status(cls, status: int) -> Exit:
        if os.WIFSIGNALED(status):
            return cls(None, os.WTERMSIG(status))
        return cls(os.waitstatus_to_exitcode(status), None)

    def exit_code(self) -> int:
        if self.signal is not None:
            return 128 + self.signal
        assert self.code is not None  # from_status gives a code whenever there is no signal
        return self.code

    def to_json(self) -> dict:
        return {"code": self.code, "signal": self.signal}
