"""Starting a granted turn: from its grant to a running guard that is followed and recorded.

Design note. The log directory is made before the guard starts, so a turn whose directory cannot be
made (the common failure) never leaves a guard behind; so is the turn's cgroup path. A guard asked
of the zygote (supervisor.guards.launcher) is started when its answer comes, on the loop; meanwhile the
turn stays in STARTING (a cancel then is kept by the ending table and acted on once it runs). The
turn's cgroup is named in its slot before the guard is asked for (Slot.name_cgroup: with the
guard's own check, a supervisor killed at any point leaves no CMD running under a slot that reads
free). Once the guard runs, it is followed (its logs opened, its pipes and exit watched) and its
work recorded in the slot, and it is reported started once the guard says CMD runs and its record
is written (its start pipe closed: GuardProcess.when_ready), so that a supervisor killed at any
moment after `started` leaves a turn that can be adopted; if following or recording fails, the
turn is still reported started and at once cancelled: the guard ends its work, `Endings.tick` watches for the guard's end when its exit could
not be followed (`turn.followed` is False), and the slot is released only when that work is
confirmed gone. Never a running guard that nobody watches.

Everything that comes of a start reaches the ending table as a `What`, through `happen`:
START_FAILED (no guard), STARTED, then CANCEL when following or recording failed, and later
GUARD_ENDED from the guard's exit. `on_running(turn, cgroup)` tells the endings the guard runs
(they keep its cgroup and start time for the outcome and the release).

Knows the state directory's turn logs, the guard starter and the guard's interface
(supervisor.turns.seams), the slot's `record_work`, and cgroup paths; nothing of the ending table's
phases or actions, queue order, grants or sockets.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Protocol

from ..errors import CcsupError
from ..guards import containment
from ..guards.handle import LOG_FILES, GuardSpec
from ..output.chunks import Chunk
from ..paths import StatePaths
from . import telemetry
from .endings import What
from .ledger import Ledger
from .seams import Guard, GuardSettings, PendingStart, StartGuard
from .states import Item, Turn

log = logging.getLogger("ccsup.starting")


def _guard_env(turn: Turn, key_env: Mapping[str, str]) -> dict[str, str | None]:
    """What the guard starter adds to the supervisor's environment: the turn's `env`, then
    `key_env` (`[env."<key>"]` of the key whose slot it holds: a pool member's account) over it;
    for an `env_replace` turn, also the removal of every variable of ours neither names, so that
    its environment is exactly those (the caller's, for `ccsup run`, and its key's); and, in
    either, `OTEL_RESOURCE_ATTRIBUTES` with the turn's own after the caller's
    (supervisor.turns.telemetry)."""
    ours = telemetry.turn_attributes(turn.id, turn.key, turn.holder.session, turn.holder.agent)
    if telemetry.VARIABLE in turn.env:
        own = turn.env[telemetry.VARIABLE]
    else:
        own = None if turn.env_replace else os.environ.get(telemetry.VARIABLE)
    attributes = {telemetry.VARIABLE: telemetry.merged(own, ours)}
    if not turn.env_replace:
        return {**turn.env, **key_env, **attributes}
    named = turn.env.keys() | key_env.keys()
    drop: dict[str, str | None] = {name: None for name in os.environ if name not in named}
    return {**drop, **turn.env, **key_env, **attributes}


class Happen(Protocol):
    """What a start reports to the ending table (supervisor.turns.endings.Endings.happen)."""

    def __call__(self, item: Item, what: What, *, reason: str | None = None) -> None: ...


class Starter:
    def __init__(
        self,
        ledger: Ledger,
        *,
        paths: StatePaths,
        start_guard: StartGuard,
        settings: Callable[[], GuardSettings],
        happen: Happen,
        on_running: Callable[[Turn, str | None], None],
        cgroups: containment.Cgroups | None = None,
    ):
        self.ledger = ledger
        self.paths = paths
        self.start_guard = start_guard
        self.settings = settings
        self.happen = happen
        self.on_running = on_running
        self.cgroups = cgroups  # where turns' cgroups go; None: no cgroups (tests, "off")

    def prepare(self, turn: Turn) -> None:
        """The turn's log directory and files, made off the loop (see supervisor.filework): for a
        turn that waits, ahead; for one that starts, while its guard is being started. Once."""
        if not turn.logs_asked:
            turn.logs_asked = True
            self.ledger.files.make_soon(self.paths.turn_dir(turn.id), LOG_FILES)

    def start(self, turn: Turn) -> None:
        """Start the granted turn's guard and follow it; any failure ends in one terminal event."""
        settings = self.settings()
        log_dir = self.paths.turn_dir(turn.id)
        try:
            log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as e:
            why = f"unable to create the turn's log directory {log_dir}: {e.strerror or e}"
            self.happen(turn, What.START_FAILED, reason=why)
            return
        # Its files are made by the file thread while the zygote forks the guard, so that they
        # exist (and only need opening) when it is followed; one that is late is made then.
        self.prepare(turn)
        try:
            cgroup = (
                self.cgroups.turn_path(turn.id, turn.slot_key) if self.cgroups is not None else None
            )
        except OSError as e:
            self.happen(turn, What.START_FAILED, reason=f"unable to set the turn's limits: {e}")
            return
        if cgroup is not None:
            try:  # before the guard exists: see Slot.name_cgroup
                assert turn.slot is not None
                turn.slot.name_cgroup(cgroup)
            except (OSError, CcsupError) as e:
                why = f"unable to record the turn's cgroup in its slot: {e}"
                self.happen(turn, What.START_FAILED, reason=why)
                return
        started: Guard | PendingStart | OSError
        try:
            started = self.start_guard(
                GuardSpec(
                    turn.id,
                    turn.argv,
                    cwd=turn.cwd,
                    env=_guard_env(turn, settings.key_env.get(turn.slot_key, {})),
                    record_dir=self.paths.guards,
                    grace=settings.grace,
                    scan=settings.scan,
                    bus=settings.bus_in,
                    cgroup=cgroup,
                    stdin=turn.stdin,
                    winsize=turn.winsize,
                    log_dir=log_dir,
                    adopt_within=settings.adopt_within,
                )
            )
        except OSError as e:
            started = e
        turn.env = {}  # the guard (or its request) has it; nothing here keeps it longer
        then = partial(self._guard_started, turn, log_dir, cgroup)
        if isinstance(started, PendingStart):  # asked of the zygote: its answer comes later
            started.then(then)
        else:
            then(started)

    def _guard_started(
        self, turn: Turn, log_dir: Path, cgroup: str | None, guard: Guard | OSError
    ) -> None:
        """The guard runs (or could not be started): follow it, record its work, say started."""
        if isinstance(guard, OSError):
            why = f"unable to start the guard: {guard.strerror or guard}"
            self.happen(turn, What.START_FAILED, reason=why)
            return
        turn.guard = guard
        self.on_running(turn, cgroup)
        extra = {"cgroup": cgroup} if cgroup is not None else {}
        problem = None
        try:
            guard.attach(
                asyncio.get_running_loop(),
                log_dir,
                on_output=partial(self._on_output, turn),
                on_exit=partial(self._on_guard_exit, turn),
            )
        except OSError as e:
            turn.followed = False  # Endings.tick watches for its end instead
            problem = f"unable to follow the guard of turn {turn.id}: {e}"
        else:
            self._hand_over_stdin(turn, guard)
            try:
                assert turn.slot is not None
                command = {"argv": turn.argv, "cwd": turn.cwd}
                turn.slot.record_work(
                    guard.identity, str(guard.record_path), [], **extra, command=command
                )
            except (OSError, CcsupError) as e:
                problem = f"unable to record the work of turn {turn.id} in its slot: {e}"
        # `started` once the guard has CMD running and its record (its channel) on disk: a
        # supervisor killed from then on leaves a turn the next one adopts (GuardProcess.when_ready)
        guard.when_ready(asyncio.get_running_loop(), partial(self._ready, turn, problem))

    def _ready(self, turn: Turn, problem: str | None) -> None:
        self.happen(turn, What.STARTED)
        if problem is not None:
            log.error("%s; stopping it", problem)
            self.happen(turn, What.CANCEL, reason=problem)

    def follow_adopted(self, turn: Turn, guard: Guard) -> None:
        """An adopted turn's guard (supervisor.turns.adopt), followed as a started one is: its
        logs, its exit. OSError when it cannot be (the caller stops the turn)."""
        turn.guard = guard
        guard.attach(
            asyncio.get_running_loop(),
            self.paths.turn_dir(turn.id),
            on_output=partial(self._on_output, turn),
            on_exit=partial(self._on_guard_exit, turn),
        )

    def _hand_over_stdin(self, turn: Turn, guard: Guard) -> None:
        """What `send` took while the guard was being started goes to the guard first, in order."""
        if turn.early_stdin or turn.early_eof:
            data, eof = bytes(turn.early_stdin), turn.early_eof
            turn.early_stdin.clear()
            try:
                guard.write_stdin(data, eof)
            except OSError as e:  # the turn's stdin is already gone: as a send to it would fail
                log.warning("unable to write the stdin sent early to turn %s: %s", turn.id, e)

    def _on_output(self, turn: Turn, stream: str, chunk: Chunk) -> None:
        self.ledger.emit(f"turn.{turn.id}.{stream}", chunk.body(turn.id))

    def _on_guard_exit(self, turn: Turn) -> None:
        assert turn.guard is not None
        if turn.guard.reap() is None:
            return
        turn.guard.close()
        self.happen(turn, What.GUARD_ENDED)
