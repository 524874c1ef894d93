"""The one exception family at ccsup's boundaries, each kind with its exit code.

Every OS error that crosses a boundary is wrapped with the operation and the object it was about,
then the OS reason: "unable to <operation> <object>: <reason>". The CLI catches only CcsupError;
anything else is a bug and shows a traceback.
"""

from __future__ import annotations


class CcsupError(Exception):
    """A failure a person can act on. exit_code is what the CLI exits with."""

    exit_code = 1
    code = "failed"  # the protocol's error code

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class UsageError(CcsupError):
    """Bad input: a config file, a CLI argument, a request field. Nothing was changed."""

    exit_code = 2
    code = "bad_request"


class ConfigError(UsageError):
    code = "bad_config"


class NotRunning(CcsupError):
    """No supervisor answers on this state directory."""

    exit_code = 3
    code = "not_running"


class AlreadyRunning(CcsupError):
    exit_code = 1
    code = "already_running"


class UnreadableState(CcsupError):
    """A record or directory that cannot be read or parsed; it is never taken for free."""

    code = "unreadable"


def os_failure(operation: str, obj: object, err: OSError) -> CcsupError:
    """Wrap an OSError: 'unable to <operation> <object>: <reason>'."""
    reason = err.strerror or str(err)
    return CcsupError(f"unable to {operation} {obj}: {reason}")
