"""Ending recorded work: polite, then firm, then confirmed. Blocking; the supervisor runs it in a thread.

Given the groups a turn's work was recorded in, its guard's identity and its turn id, end it all:
SIGTERM (then SIGCONT, so a stopped process sees it) to every live group and to the guard, wait up
to the grace for them to go, then SIGKILL what is left together with every process that still
carries the turn's marker in its environment (an escapee in a group nobody recorded), and confirm
everything gone within a bounded wait. The marker is `CCSUP_TURN=<turn>` together with
`CCSUP_SCOPE=<scope>` of this state directory's guard records (guardd.record.record_dir_scope):
turn ids are made by clients, so another supervisor (another user, another state directory) may
run a turn with the same id, and its processes are never ours to end. Without a scope (the record
directory cannot be read) no process is ended by its marker alone.

Knows signals and group liveness (from guardd); nothing of slots or records. Each round judges
every group together (guardd.procs.live_groups: one pass over /proc, not one per group). A group
that live_groups says is gone is never signalled: its pgid may belong to someone else by now. Holds no
state: running it again on the same work is safe (what is gone is skipped), and stopping half-way
leaves the work partly ended, which the next run finishes.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Iterable

from guardd import procs
from guardd.cgroup import kill as kill_cgroup
from guardd.cgroup import wait_empty
from guardd.procs import Group, Identity
from guardd.record import SCOPE_ENV, TURN_ENV

from ..polling import wait_until

POLL = 0.01  # seconds between liveness checks while waiting
CONFIRM_MIN = 2.0  # the least time allowed for SIGKILLed work to be confirmed gone

log = logging.getLogger("ccsup.reaper")


def end_work(
    groups: list[Group],
    *,
    guard: Identity | None = None,
    turn: str | None = None,
    scope: str | None = None,
    grace: float = 5.0,
    cgroup: str | None = None,
) -> bool:
    """End the work; True when it is confirmed gone, False when something still runs.

    turn and scope: the marker of escapees (see above); both or no sweep for them.
    With the turn's cgroup, SIGKILL goes to all of it at once (cgroup.kill) after the grace, and
    gone also needs `populated 0`, waited for on cgroup.events' notification."""
    groups = list(dict.fromkeys(groups))
    marked = marked_processes(turn, scope)
    denied = _signal_all(groups, guard, marked, (signal.SIGTERM, signal.SIGCONT))
    _wait_gone(groups, guard, marked, grace, cgroup)
    # Escapees may have started during the grace: look again before the firm round.
    marked = list(dict.fromkeys(marked + marked_processes(turn, scope)))
    if not _all_gone(groups, guard, marked):
        left = _describe(groups, guard, marked)
        log.warning(
            "work of turn %s still running after %.1fs grace, sending SIGKILL to %s",
            turn,
            grace,
            left,
        )
        denied |= _signal_all(groups, guard, marked, (signal.SIGKILL,))
    if cgroup is not None:
        try:
            kill_cgroup(cgroup)
        except OSError as e:
            log.error("%s", e)
            denied = True
    if _wait_gone(groups, guard, marked, max(CONFIRM_MIN, grace), cgroup):
        return True
    reason = "permission denied" if denied else "still alive after SIGKILL"
    log.error(
        "unable to end the work of turn %s (%s): %s", turn, reason, _describe(groups, guard, marked)
    )
    return False


def marked_processes(turn: str | None, scope: str | None) -> list[Identity]:
    """Live processes of this turn of this state directory, found by their marker."""
    if not turn or not scope:
        return []
    return procs.processes_with_env(TURN_ENV, turn, also={SCOPE_ENV: scope})


def _signal_all(
    groups: list[Group], guard: Identity | None, marked: list[Identity], sigs: Iterable[int]
) -> bool:
    """Send each signal to what is alive; True when some signal was refused (EPERM)."""
    denied = False
    live = procs.live_groups(groups)
    for sig in sigs:
        for group in groups:
            if group not in live:
                continue
            try:
                procs.signal_group(group.pgid, sig)
            except PermissionError:
                denied = True
        for ident in ([guard] if guard is not None else []) + marked:
            try:
                procs.signal_process(ident, sig)
            except PermissionError:
                denied = True
    return denied


def _all_gone(groups: list[Group], guard: Identity | None, marked: list[Identity]) -> bool:
    if guard is not None and procs.process_running(guard):
        return False
    if any(procs.process_running(i) for i in marked):
        return False
    return not procs.live_groups(groups)


def _wait_gone(groups, guard, marked, timeout: float, cgroup: str | None = None) -> bool:
    if cgroup is not None and not wait_empty(cgroup, timeout):
        return False  # woken by cgroup.events, not polled
    try:
        return wait_until(lambda: _all_gone(groups, guard, marked), timeout, POLL)
    except TimeoutError:
        return False


def _describe(groups, guard, marked) -> str:
    live = procs.live_groups(groups)
    parts = [f"group {g.pgid}" for g in groups if g in live]
    if guard is not None and procs.process_running(guard):
        parts.append(f"guard {guard.pid}")
    parts.extend(f"process {i.pid}" for i in marked if procs.process_running(i))
    return ", ".join(parts) or "nothing"
