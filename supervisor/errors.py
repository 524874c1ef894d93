"""The one exception family at ccsup's boundaries, each kind with its exit code and its code on
the wire.

Every OS error that crosses a boundary is wrapped with the operation and the object it was about,
then the OS reason: "unable to <operation> <object>: <reason>". The CLI catches only CcsupError
and exits with its `exit_code`; anything else is a bug and shows a traceback. In the supervisor,
a CcsupError that ends a control request becomes an error reply with its `code` (one of
protocol.ERROR_CODES); the client turns a reply's code back into an exit code with
`exit_code_for`, so a bad configuration exits 2 whether the CLI or the supervisor found it.
"""

from __future__ import annotations

# The reply codes that mean the request or its input was wrong: the CLI exits 2 for them.
USAGE_CODES = ("bad_request", "too_large", "unknown_command", "unsupported_version")


class CcsupError(Exception):
    """A failure a person can act on. exit_code is what the CLI exits with; code is the error
    code of the reply it becomes when it ends a control request."""

    exit_code = 1
    code = "failed"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class UsageError(CcsupError):
    """Bad input: a config file, a CLI argument, a request field. Nothing was changed."""

    exit_code = 2
    code = "bad_request"


class ConfigError(UsageError):
    """A configuration that cannot serve: a bad file, `--caps`, a refused endpoint."""


class NotRunning(CcsupError):
    """No supervisor answers on this state directory (found by the client; never a reply)."""

    exit_code = 3


class SupervisorLost(CcsupError):
    """The supervisor of a followed turn died and none answered again in time (adopt_within and a
    margin): the turn's end is not known (found by the client; never a reply)."""

    exit_code = 71  # `ccsup run`'s too (supervisor.cli.run.exits)


class UnknownTurn(CcsupError):
    """An id that neither the supervisor nor the history knows: `show`, `wait`, `logs` and
    `cancel` say it in these words and exit 1 (a failure to find, not a usage error)."""

    code = "not_found"

    def __init__(self, turn_id: str, state_dir: object = None):
        where = f" on {state_dir}" if state_dir is not None else ""
        super().__init__(
            f"no turn {turn_id}{where}: neither the supervisor nor the history knows it "
            "(never asked here, or ended before [logs] keep)"
        )


class AlreadyRunning(CcsupError):
    """A second supervisor on a state directory that has one (found at start; never a reply)."""


def exit_code_for(code: str) -> int:
    """The CLI's exit code for a supervisor's error reply with this code: 2 usage, else 1."""
    return UsageError.exit_code if code in USAGE_CODES else CcsupError.exit_code


def os_failure(operation: str, obj: object, err: OSError) -> CcsupError:
    """Wrap an OSError: 'unable to <operation> <object>: <reason>'."""
    reason = err.strerror or str(err)
    return CcsupError(f"unable to {operation} {obj}: {reason}")
