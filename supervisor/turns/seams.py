"""The outside world as the turn logic sees it: the slot gate, guards, and time.

The manager, the ledger, the starter and the endings take each of these in their constructors,
with the real one as the default (supervisor.slots.gate.SlotGate, supervisor.guards.handle's guards, the event
loop's timers, supervisor.turns.gone.Probe), so tests replay histories against fakes without a process,
a lock or a sleep (tests/test_manager_logic.py). Only the methods named here are used.

Knows interfaces; nothing of how they are implemented.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from guardd.procs import Identity

from ..guards.handle import GuardSpec
from ..output.chunks import Chunk
from ..slots.gate import Slot, SlotView
from ..slots.views import KeyTally


class Gate(Protocol):
    """What the manager uses of the slot gate (supervisor.slots.gate.SlotGate; a fake in tests)."""

    def try_acquire(
        self,
        key: str,
        holder: Any,
        *,
        turn: str | None = None,
        reservation: dict[str, Any] | None = None,
    ) -> Slot | None: ...
    def inspect_all(self) -> list[SlotView]: ...
    def survey(self) -> tuple[list[SlotView], list[KeyTally]]: ...


class Guard(Protocol):
    """What the starter and the endings use of a guard (spawn.GuardProcess; a fake in tests)."""

    identity: Identity
    record_path: Path
    returncode: int | None

    def attach(
        self,
        loop: Any,
        log_dir: Path,
        on_output: Callable[[str, Chunk], None],
        on_exit: Callable[[], None],
    ) -> None: ...
    def when_ready(self, loop: Any, callback: Callable[[], None]) -> None: ...
    def terminate(self) -> bool: ...
    def terminate_if_pending(self) -> None: ...
    def reap(self) -> int | None: ...
    def close(self) -> None: ...
    def drain(self) -> None: ...
    def write_stdin(self, data: bytes, eof: bool = False) -> int: ...
    def resize(self, rows: int, cols: int) -> None: ...
    def hand_over(self) -> dict[str, int]: ...
    @property
    def stdin_pending(self) -> int: ...


@runtime_checkable
class PendingStart(Protocol):
    """A guard asked for and not started yet (supervisor.guards.launcher.PendingGuard): `then` calls
    back once, from the event loop, with the Guard or the OSError that kept it from starting."""

    def then(self, callback: Callable[[Any], None]) -> None: ...


class StartGuard(Protocol):
    """Starts a turn's guard from its GuardSpec (supervisor.guards.handle.start_guard, or the
    Launcher's, which may answer later: PendingStart); OSError if it cannot."""

    def __call__(self, spec: GuardSpec, /) -> Guard | PendingStart: ...


class GuardSettings(Protocol):
    """The settings a guard is started with (read at each start: a reload changes them)."""

    @property
    def grace(self) -> float: ...
    @property
    def scan(self) -> float: ...
    @property
    def bus_in(self) -> str | None: ...
    @property
    def adopt_within(self) -> float: ...
    @property
    def key_env(self) -> Mapping[str, Mapping[str, str]]: ...


class Timer(Protocol):
    def cancel(self) -> None: ...


class Timers(Protocol):
    """When to call back: the event loop in the daemon, a scripted clock in tests."""

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer: ...


class LoopTimers:
    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        return asyncio.get_running_loop().call_later(delay, callback)
