"""The machine's room: may a head be granted for the memory its key is predicted to use, and is
the machine under memory pressure (`[memory]`, supervisor.config.memory).

Design note. A key's prediction is the 90th percentile (nearest rank) of its last PEAKS whole-
tree peaks (`peak_mem` of its exited turns: guardd.treemem), read from the history once at start
(`load`, in a thread) and kept up to date from each `exited` event; else the key's `estimate`;
else none, and such a key is admitted by its caps alone. A running turn (granted, started or
adopted, until its item is finished) counts, with `budget` a size, the larger of its key's
prediction and what it uses now; with `"auto"` the room is MemAvailable now less `reserve` less
what the running turns are still predicted to grow (prediction minus what each uses now), so memory
used outside ccsup counts too. "What each uses now" is the `mem` its guard last wrote in its
record (guardd.usage), read by `refresh` in a worker thread every REFRESH seconds: nothing here
walks /proc, and the decision on the loop reads only memory and two small kernel files
(/proc/meminfo for "auto", /proc/pressure/memory at most every REFRESH). A just-granted turn has no
figure yet and counts its whole prediction.

Order: only a key's head is ever asked (supervisor.turns.manager), oldest head first; a head held
for room is remembered, and a younger head of another key that needs room waits behind it
(`memory`, "behind ..."), so small turns of other keys cannot starve a big one. A head whose
prediction is larger than the whole budget can never fit: it is granted once no turn counted here
runs ("runs alone"), and its WHY says so meanwhile. Reservations are admitted by caps alone (their
work is not a turn ccsup measures), but the pressure brake holds them too.

The pressure brake: while PSI memory `some avg10` (a percentage in the kernel's file, compared
with `pressure` as a share) is at or above `pressure`, nothing is granted (`pressure`), and
`supervisor.pressure {on, avg10}` is published when that starts and when it stops. No
/proc/pressure (a kernel without PSI): the brake is off and `view` says so; the budget is
unchanged. Running turns are never ended for memory. `CCSUP_TEST_PSI_FILE` (tests only) names
another file to read in place of /proc/pressure/memory.

State: in memory only. The peaks come back from the history at each start (a history that cannot
be read: predictions from the estimates alone, said once in the log); the running turns and their
figures from the ledger's events (followed from the room's construction: it is given the
manager's `Turns`, supervisor.turns.manager) and the next refresh. Knows guard records through
supervisor.guards.containment; nothing of slots or sockets.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from ..config.memory import AUTO, MemorySettings, estimate_for
from ..guards import containment
from ..turns.manager import Turns
from ..turns.states import Item, Turn
from .policy import WaitReason, Why

PEAKS = 20  # a key's prediction is the p90 of this many last peaks
PERCENTILE = 0.90
REFRESH = 1.0  # seconds between readings of the running turns' figures and of PSI
PSI_FILE = "/proc/pressure/memory"
PSI_ENV = "CCSUP_TEST_PSI_FILE"  # tests only: read this file in place of PSI_FILE

log = logging.getLogger("ccsup.memory")


def gib(n: int | float) -> str:
    """Bytes as the status line shows them ("1.20GiB", "300MiB")."""
    if abs(n) >= 1 << 30:
        return f"{n / (1 << 30):.2f}GiB"
    return f"{n / (1 << 20):.0f}MiB"


def p90(peaks: list[int] | deque[int]) -> int | None:
    """The 90th percentile by nearest rank (of 20 peaks, the 18th smallest); None for none."""
    if not peaks:
        return None
    ordered = sorted(peaks)
    rank = max(1, -(-len(ordered) * 9 // 10))  # ceil(0.9 n)
    return ordered[rank - 1]


def read_meminfo(path: str = "/proc/meminfo") -> dict[str, int]:
    """MemTotal and MemAvailable in bytes ({} when unreadable)."""
    found: dict[str, int] = {}
    try:
        with open(path, "rb") as f:
            for line in f:
                name, _, rest = line.partition(b":")
                if name in (b"MemTotal", b"MemAvailable"):
                    found[name.decode()] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return {}
    return found


def read_psi(path: str) -> float | None:
    """`some avg10` of a PSI file as a share (0-1); None when there is no such file (no PSI)."""
    try:
        with open(path, "rb") as f:
            data = f.read(512)
    except OSError:
        return None
    for line in data.splitlines():
        if line.startswith(b"some "):
            for field in line.split()[1:]:
                if field.startswith(b"avg10="):
                    try:
                        return float(field[6:]) / 100.0
                    except ValueError:
                        return None
    return None


class MachineRoom:
    def __init__(
        self,
        settings: MemorySettings,
        turns: Turns | None = None,
        *,
        publish: Callable[[str, dict], None] = lambda topic, body: None,
        meminfo: Callable[[], dict[str, int]] = read_meminfo,
        psi_file: str | None = None,
        clock: Callable[[], float] | None = None,
    ):
        self.settings = settings
        self.publish = publish
        self.meminfo = meminfo
        self.psi_file = psi_file or os.environ.get(PSI_ENV) or PSI_FILE
        self.psi = os.path.exists(self.psi_file)  # False: no PSI here, the brake is off
        import time

        self.clock = clock or time.monotonic
        self.peaks: dict[str, deque[int]] = {}
        self.running: dict[str, str] = {}  # turn id -> key, from its grant to its finish
        self.using: dict[str, int] = {}  # turn id -> bytes its tree uses now (its guard's record)
        self.held: dict[str, tuple[float, str]] = {}  # head id -> (requested_at, key), for room
        self.avg10: float | None = None
        self.pressured = False
        self._psi_at = float("-inf")
        self.alone: str | None = None  # a head granted alone (it can never fit with others)
        # The manager (supervisor.turns.manager.Turns): its ledger's events and finished items
        # are followed from here on, and grants asked of it. None: a room alone (tests), which
        # sees no events and asks for no grants.
        self.turns = turns
        if turns is not None:
            turns.ledger.observers.append(self._observe)
            turns.ledger.on_finished.append(lambda item: self.finished(item.id))

    def grant(self) -> None:
        """The manager's grant round (a head held for room is asked again)."""
        if self.turns is not None:
            self.turns.grant_waiters()

    def lookup(self, item_id: str) -> Item | None:
        return self.turns.ledger.get(item_id) if self.turns is not None else None

    def load(self, peaks: Mapping[str, list[int]]) -> None:
        """The history's last peaks of each key (oldest first), taken at start."""
        for key, values in peaks.items():
            self.peaks[key] = deque(values[-PEAKS:], maxlen=PEAKS)

    def retune(self, settings: MemorySettings) -> None:
        self.settings = settings
        self.grant()

    def _observe(self, topic: str, body: dict[str, Any]) -> None:
        parts = topic.split(".")
        if len(parts) != 3 or parts[0] != "turn":
            return
        kind = parts[2]
        if kind in ("granted", "started", "adopted"):
            item = self.lookup(parts[1])
            if isinstance(item, Turn):
                member = body.get("member")  # a pool's turn runs on (and is predicted as) it
                known = self.running.get(item.id)
                self.running[item.id] = member if isinstance(member, str) else known or item.key
                self.held.pop(item.id, None)
        elif kind == "exited":
            peak = body.get("peak_mem")
            key = body.get("key") or self.running.get(parts[1])
            if isinstance(peak, int) and peak > 0 and isinstance(key, str):
                self.learn(key, peak)

    def learn(self, key: str, peak: int) -> None:
        self.peaks.setdefault(key, deque(maxlen=PEAKS)).append(peak)

    def finished(self, item_id: str) -> None:
        self.held.pop(item_id, None)
        self.using.pop(item_id, None)
        if self.running.pop(item_id, None) is not None and self.alone == item_id:
            self.alone = None

    # -- figures ---------------------------------------------------------------------------------

    def prediction(self, key: str) -> tuple[int | None, str | None]:
        """(bytes, where it comes from: "learned" or "estimate"), or (None, None)."""
        learned = p90(self.peaks.get(key) or [])
        if learned is not None:
            return learned, "learned"
        estimate = estimate_for(self.settings, key)
        if estimate is not None:
            return estimate, "estimate"
        return None, None

    def counted(self, turn_id: str, key: str) -> tuple[int, int]:
        """(what a running turn counts against a size budget, what it may still grow)."""
        predicted = self.prediction(key)[0] or 0
        now = self.using.get(turn_id, 0)
        return max(predicted, now), max(predicted - now, 0)

    def predicted_use(self) -> int:
        """What the running turns are predicted to use together (each: max(prediction, now))."""
        return sum(self.counted(t, k)[0] for t, k in self.running.items())

    def room(self) -> tuple[int, int] | None:
        """(room now, the whole budget) in bytes; None without a budget or /proc/meminfo."""
        budget = self.settings.budget
        if budget is None:
            return None
        if budget == AUTO:
            info = self.meminfo()
            if "MemAvailable" not in info:
                return None
            grow = sum(self.counted(t, k)[1] for t, k in self.running.items())
            whole = info.get("MemTotal", info["MemAvailable"]) - self.settings.reserve
            return info["MemAvailable"] - self.settings.reserve - grow, whole
        assert isinstance(budget, int)
        return budget - self.predicted_use(), budget

    def pressure_now(self) -> float | None:
        """PSI's `some avg10` share, read at most every REFRESH seconds; None without PSI."""
        if not self.psi:
            return None
        now = self.clock()
        if now - self._psi_at >= REFRESH:
            self._psi_at = now
            self.avg10 = read_psi(self.psi_file)
        return self.avg10

    # -- the decision ------------------------------------------------------------------------------

    def hold(self, item: Item, now: float, key: str | None = None) -> Why | None:
        """Why `item` (a key's head) may not be granted for memory now, else None. `key`: the
        pool member it would run on (its prediction is that key's), default its own key."""
        key = key or item.key
        limit = self.settings.pressure
        if limit > 0:
            avg10 = self.pressure_now()
            self._set_pressure(avg10 is not None and avg10 >= limit, avg10)
            if self.pressured:
                assert avg10 is not None
                detail = (
                    f"memory pressure: PSI some avg10 {avg10 * 100:.2f}% is at or above "
                    f"{limit * 100:g}% ([memory] pressure)"
                )
                return Why(WaitReason.PRESSURE, None, detail)
        if not isinstance(item, Turn) or self.settings.budget is None:
            return None
        need, source = self.prediction(key)
        if need is None:
            return None
        older = [
            (at, other, key)
            for other, (at, key) in self.held.items()
            if other != item.id and at < item.requested_at
        ]
        if older:
            at, other, other_key = min(older)
            detail = f"behind turn {other} of key {other_key}, older and waiting for memory room"
            self.held[item.id] = (item.requested_at, key)
            return Why(WaitReason.MEMORY, None, detail)
        figures = self.room()
        if figures is None:
            return None  # no /proc/meminfo for "auto": admitted by caps alone
        room, whole = figures
        what = f"needs {gib(need)} ({source} peak of {key})"
        if need <= room:
            self.held.pop(item.id, None)
            return None
        if need > whole:
            if not self.running:
                self.held.pop(item.id, None)
                self.alone = item.id
                log.info("turn %s (%s) can never fit the budget: it runs alone", item.id, what)
                return None
            detail = (
                f"{what}, more than the whole budget {gib(whole)}: it runs alone, once the "
                f"{len(self.running)} running turn(s) end"
            )
        else:
            detail = f"{what}; room {gib(max(room, 0))} of budget {self._budget_text()}"
            detail += f", running turns predicted {gib(self.predicted_use())}"
        self.held[item.id] = (item.requested_at, key)
        return Why(WaitReason.MEMORY, None, detail)

    def _budget_text(self) -> str:
        budget = self.settings.budget
        if budget == AUTO:
            return f"auto (MemAvailable less reserve {gib(self.settings.reserve)})"
        assert isinstance(budget, int)
        return gib(budget)

    def _set_pressure(self, on: bool, avg10: float | None) -> None:
        if on == self.pressured:
            return
        self.pressured = on
        log.info("memory pressure %s (PSI some avg10 %s)", "on" if on else "off", avg10)
        self.publish("supervisor.pressure", {"on": on, "avg10": avg10})

    # -- refresh (a periodic duty) -------------------------------------------------------------------

    async def refresh(self) -> None:
        """Read what the running turns use now (their guards' records, in a thread) and PSI; grant
        when a held head may fit now or the pressure has ended."""
        if self.settings.budget is not None and self.running:
            paths = {}
            for turn_id in self.running:
                item = self.lookup(turn_id)
                if isinstance(item, Turn) and item.guard is not None:
                    paths[turn_id] = item.guard.record_path
            using = await asyncio.to_thread(_read_using, paths)
            for turn_id, mem in using.items():
                if turn_id in self.running:
                    self.using[turn_id] = mem
        was = self.pressured
        if self.settings.pressure > 0 and self.psi:
            self._psi_at = float("-inf")
            avg10 = self.pressure_now()
            self._set_pressure(avg10 is not None and avg10 >= self.settings.pressure, avg10)
        else:
            self._set_pressure(False, self.avg10)
        if self.held or (was and not self.pressured):
            self.grant()

    # -- what status, ps and metrics show ----------------------------------------------------------

    def view(self) -> dict[str, Any]:
        """`status`'s `memory`: the budget, the running turns' predicted use, the pressure, and
        which parts are off here."""
        figures = self.room() if self.settings.budget is not None else None
        off = []
        if not self.psi:
            off.append(f"pressure brake: no PSI ({self.psi_file} missing)")
        elif self.settings.pressure <= 0:
            off.append("pressure brake: [memory] pressure = 0")
        budget_bytes = self.settings.budget
        if budget_bytes == AUTO:
            available = self.meminfo().get("MemAvailable")
            budget_bytes = None if available is None else available - self.settings.reserve
        return {
            "budget": self.settings.budget,
            "budget_bytes": budget_bytes,
            "reserve": self.settings.reserve,
            "room": figures[0] if figures else None,
            "whole": figures[1] if figures else None,
            "predicted": self.predicted_use(),
            "running": len(self.running),
            "pressure": self.settings.pressure,
            "avg10": self.avg10 if self.psi else None,
            "pressured": self.pressured,
            "psi": self.psi,
            "off": off,
            "alone": self.alone,
            "keys": {
                key: {"prediction": value, "source": source}
                for key in sorted(set(self.peaks) | set(self.settings.estimate))
                for value, source in [self.prediction(key)]
            },
        }


def _read_using(paths: Mapping[str, Any]) -> dict[str, int]:
    """Blocking (a worker thread): each running turn's `mem` from its guard's record."""
    found = {}
    for turn_id, path in paths.items():
        used = containment.usage_so_far(path)
        mem = (used or {}).get("mem")
        if isinstance(mem, int):
            found[turn_id] = mem
    return found
