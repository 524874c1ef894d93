"""What `ccsup run` promises a script: the key it uses without flags, and exit codes a script can
tell apart. Pure: no I/O.

The key: `--key`, else `$CCSUP_KEY`, else `default`.

Exit codes (also in `ccsup run --help` and the README):

    CMD's own status   the command ran (128+N when a signal N ended it)
    124                --timeout (or the key's max_runtime) stopped it, as timeout(1) does
    75                 --wait-timeout ran out before a slot was granted (EX_TEMPFAIL: try later)
    130                Ctrl-C: the turn was cancelled from this terminal
    69                 another client (or the supervisor stopping) cancelled it (EX_UNAVAILABLE)
    65                 the supervisor rejected the request (EX_DATAERR)
    125                the turn's guard was lost, or it ended without an exit status
    71                 its supervisor died and none answered again within adopt_within + 5 s
    2, 3               usage error; no supervisor running (before the turn was asked for)

Knows events' fields; nothing of sockets or terminals.
"""

from __future__ import annotations

from collections.abc import Mapping

from ...errors import SupervisorLost

DEFAULT_KEY = "default"
EXIT_TIMEOUT = 124
EXIT_WAIT_TIMEOUT = 75
EXIT_INTERRUPTED = 130
EXIT_CANCELLED = 69
EXIT_REJECTED = 65
EXIT_LOST = 125
EXIT_SUPERVISOR_LOST = SupervisorLost.exit_code  # 71: no supervisor came back (ride_through)

EXIT_CODES_HELP = (
    "Exit status: CMD's own (128+N for signal N); 124 when --timeout or the key's max_runtime "
    "stopped it; 75 when --wait-timeout ran out before a slot; 130 on Ctrl-C; 69 when another "
    "client or the supervisor cancelled it; 65 when the request was rejected; 125 when its guard "
    "was lost; 71 when its supervisor died and none came back within adopt_within + 5 s."
)


# Why a turn was cancelled or stopped (the event's `reason`), as `ccsup run` says it.
_REASONS = {
    "cancelled": "by `ccsup cancel`",
    "requester_gone": "its requester is gone",
    "shutdown": "the supervisor was stopped",
    "timeout": "its time limit ran out",
    "supervisor_restarted": "its supervisor ended while it ran",
    "not_adopted": "its supervisor died and none adopted it in time",
}


def ended_line(turn_id: str, kind: str, reason: str | None) -> str:
    """`ccsup run`'s last line for a turn cancelled before it started, stopped, or rejected:
    `ccsup: turn X was cancelled by `ccsup cancel``, never `cancelled: cancelled`."""
    said = _REASONS.get(reason or "", reason or "no reason given")
    if kind == "cancelled":
        what = "was cancelled before it started"
        if reason == "timeout":
            return f"ccsup: turn {turn_id} {what}: its --wait-timeout ran out"
    elif kind == "rejected":
        return f"ccsup: turn {turn_id} was rejected: {said}"
    else:
        what = "was stopped"
    joiner = " " if said.startswith("by ") else ": "
    return f"ccsup: turn {turn_id} {what}{joiner}{said}"


# A turn's `exited` reasons that mean it ended with its supervisor, not on its own.
LOST_WITH_SUPERVISOR = ("supervisor_restarted", "not_adopted")


def lost_line(turn_id: str, reason: str) -> str:
    """`ccsup run`'s last line for a turn that ended with its supervisor (its status is then
    125): why."""
    return f"ccsup: turn {turn_id} ended: {_REASONS.get(reason, reason)}"


def default_key(env: Mapping[str, str]) -> str:
    """The key of `ccsup run` without --key: $CCSUP_KEY, else "default"."""
    return env.get("CCSUP_KEY") or DEFAULT_KEY


def command_status(exited: dict | None) -> int:
    """CMD's status from its `exited` event: code, 128+signal, 125 when the guard was lost."""
    if exited is None or exited.get("reason") == "guard_lost":
        return EXIT_LOST
    if exited.get("signal"):
        return 128 + int(exited["signal"])
    code = exited.get("code")
    return int(code) if isinstance(code, int) else EXIT_LOST


def run_exit_status(
    kind: str, body: dict, exited: dict | None, stop_reason: str | None, *, interrupted: bool
) -> int:
    """The status of `ccsup run` from its turn's terminal event (`kind` with `body`), its
    `exited` event, the reason of its `stopping` event, and whether Ctrl-C cancelled it here."""
    if kind == "rejected":
        return EXIT_REJECTED
    if kind == "cancelled":  # it never had a slot
        if interrupted:
            return EXIT_INTERRUPTED
        return EXIT_WAIT_TIMEOUT if body.get("reason") == "timeout" else EXIT_CANCELLED
    if exited is not None and exited.get("reason") == "timeout":
        return EXIT_TIMEOUT
    if interrupted:
        return EXIT_INTERRUPTED
    if stop_reason is not None and stop_reason != "timeout":
        return EXIT_CANCELLED  # stopped by someone else: its own status is the signal's
    return command_status(exited)
