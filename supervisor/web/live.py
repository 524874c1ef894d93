"""What the page shows, kept live: keys, holders, the queue, recent turns, pauses.

Design note. The page's truth is the supervisor's `ps` (slots and waiters at one instant); the bus
tells what changed in between. Rather than re-deriving slot states from events (which would copy
the supervisor's logic and go wrong on a lost event), every event that can change the slots or the
queue marks the view stale and the app re-reads `ps` (coalesced, at most a few times a second),
and an event gap (`seq`) does the same. Events are kept for what `ps` does not say: each turn's
life (queued, granted, exited with its usage, released) for the timeline and the turn's page,

Pauses and start rates are other issues' work: a key's `paused_until` and `rate` come from `ps`
or `status` when they carry them (`ps["keys"]` entries, or a `pauses` mapping); otherwise they
are null and the page shows nothing for them. `key.<key>.paused|resumed` events only make the app
read `ps` again: anyone may publish on the bus, so a pause is never shown on an event's word.

Size: turns are kept for `KEEP_SECONDS` after they end and at most `MAX_TURNS` in all (the oldest
finished go first); each turn keeps at most `MAX_EVENTS` events (output chunks are only counted).

State: memory only. A restarted web app knows the turns it sees from then on (and what the
history, once it is there, gives back); `ps` gives it the present at once.

Pure: the clock is passed in; nothing here does I/O.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

from ..caps import TAKEN, SlotState

KEEP_SECONDS = 3600.0
_SLOT_STATES = frozenset(SlotState)
MAX_TURNS = 5000
MAX_EVENTS = 200
# The terminal events of a turn (or reservation).
TERMINAL = ("released", "cancelled", "rejected")
# Fields of `turn.<id>.exited` that are its outcome, not what it used.
NOT_USAGE = frozenset({"code", "signal", "reason", "error", "index", "ts", "epoch", "seq", "v"})
# Events after which the slots or the queue look different.
CHANGES_PS = {
    "queued",
    "granted",
    "started",
    "released",
    "cancelled",
    "rejected",
    "gone",
    "exited",
    "stopping",
    "adopted",
}


class KeyView(TypedDict):
    key: str
    cap: int
    held: int
    reserved: int
    orphaned: int
    unreadable: int
    free: int
    waiting: int
    paused_until: float | None
    paused_reason: str | None
    rate: str | None
    next_grant: float | None  # when the key's start-rate window lets the next grant through
    quota: list[dict[str, Any]]  # the key's provider windows (ps's keys[].quota)


class HolderView(TypedDict):
    key: str
    index: int
    state: str
    turn: str | None
    session: str | None
    agent: str | None
    since: float | None
    pid: int | None
    cpu_seconds: float | None
    rss_bytes: int | None
    command: str | None  # argv as a shell reads it back (never its environment)
    cwd: str | None
    adopted_at: float | None  # taken over from a supervisor that was gone (a badge on the page)
    adoption_gap_s: float | None  # the seconds it ran with no supervisor


class WaitView(TypedDict):
    id: str
    key: str
    position: int | None
    session: str | None
    agent: str | None
    since: float | None
    reservation: bool
    why: str | None
    why_word: str | None  # the one word (`key_full`, `paused`, `rate`): the queue's column
    command: str | None
    cwd: str | None


class Bar(TypedDict):
    id: str
    key: str
    session: str | None
    agent: str | None
    queued_at: float | None
    granted_at: float | None
    ended_at: float | None  # released, cancelled or rejected
    outcome: str  # "waiting", "running", "released", "cancelled", "rejected"
    exit_code: int | None
    reservation: bool
    adopted_at: float | None  # when a later supervisor last took it over (turn.<id>.adopted)
    adoption_gap_s: float | None  # seconds it ran with no supervisor, all its gaps


class EventView(TypedDict):
    topic: str
    ts: float | None
    body: dict[str, Any]


class TurnView(TypedDict):
    id: str
    key: str | None
    bar: Bar | None
    events: list[EventView]
    output_chunks: int
    usage: dict[str, Any] | None
    exit: dict[str, Any] | None
    active: bool
    leftovers: dict[str, Any] | None  # {"count", "names"}: what outlived its command


class StateView(TypedDict):
    keys: list[KeyView]
    holders: list[HolderView]
    waits: list[WaitView]
    supervisor: dict[str, Any]
    connected: bool
    error: str | None
    updated_at: float


Usage = Mapping[str, tuple[float, int]]  # turn id -> (CPU seconds, resident bytes)


@dataclass
class TurnTrace:
    """One turn as seen on the bus."""

    id: str
    key: str | None = None
    session: str | None = None
    agent: str | None = None
    reservation: bool = False
    queued_at: float | None = None
    granted_at: float | None = None
    ended_at: float | None = None
    outcome: str = "waiting"
    exit: dict[str, Any] | None = None
    events: list[EventView] = field(default_factory=list)
    dropped_events: int = 0
    output_chunks: int = 0
    seen_at: float = 0.0  # the clock when its last event came
    adopted_at: float | None = None
    adoption_gap_s: float | None = None
    leftovers: dict[str, Any] | None = None  # turn.<id>.leftovers: {"count", "names"}

    def bar(self) -> Bar:
        code = self.exit.get("code") if self.exit else None
        return Bar(
            id=self.id,
            key=self.key or "?",
            session=self.session,
            agent=self.agent,
            queued_at=self.queued_at,
            granted_at=self.granted_at,
            ended_at=self.ended_at,
            outcome=self.outcome,
            exit_code=code if isinstance(code, int) else None,
            reservation=self.reservation,
            adopted_at=self.adopted_at,
            adoption_gap_s=self.adoption_gap_s,
        )


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _why(value: object) -> str | None:
    """Why a waiter waits, as `ps` says it: a sentence, or {reason, until, detail}."""
    if isinstance(value, dict):
        return _str(value.get("detail")) or _str(value.get("reason"))
    return _str(value)


def _why_word(value: object) -> str | None:
    """The reason word of `ps`'s why ({reason, ...}); a sentence's first word otherwise."""
    if isinstance(value, dict):
        return _str(value.get("reason"))
    text = _str(value)
    return text.split(" ", 1)[0] if text else None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class Live:
    """The live model: `apply_ps`, `apply_event` in; `state()`, `bars()`, `turn()` out."""

    def __init__(self, clock=time.time):
        self.clock = clock
        self.ps: dict[str, Any] = {"slots": [], "waits": []}
        self.status: dict[str, Any] = {}
        self.connected = False
        self.error: str | None = None
        self.turns: dict[str, TurnTrace] = {}
        self.changed_bars: set[str] = set()
        self.updated_at = clock()
        self.ps_at = 0.0  # the clock when `ps` was last taken

    # -- in

    def apply_ps(
        self,
        ps: dict[str, Any],
        status: dict[str, Any] | None = None,
        asked_at: float | None = None,
    ) -> None:
        """Take a `ps` answer; `asked_at` is the clock when it was asked for (default: now)."""
        self.ps = ps
        if status is not None:
            self.status = status
        self.connected = True
        self.error = None
        self.updated_at = self.clock()
        self.ps_at = self.updated_at if asked_at is None else asked_at
        # A turn the bus told us about that ps shows granted or running has been granted, even
        # if its granted event came before we subscribed.
        for slot in ps.get("slots", []):
            turn_id = _str(slot.get("turn"))
            if turn_id and turn_id in self.turns:
                trace = self.turns[turn_id]
                if trace.granted_at is None and trace.ended_at is None:
                    trace.granted_at = _num(slot.get("since"))
                    trace.outcome = "running"
                    self.changed_bars.add(turn_id)
                # Adopted: a new supervisor publishes that before this page is subscribed again
                adopted_at = _num(slot.get("adopted_at"))
                if adopted_at is not None and (trace.adopted_at or 0.0) < adopted_at:
                    trace.adopted_at = adopted_at
                    if trace.adoption_gap_s is None:
                        trace.adoption_gap_s = _num(slot.get("adoption_gap_s"))
                    self.changed_bars.add(turn_id)

    def lost(self, reason: str) -> None:
        """No answer from the supervisor: the slots shown stay (marked stale by `connected`); who
        the supervisor was is forgotten, so a new one is not taken for the old."""
        self.connected = False
        self.status = {}
        self.error = reason
        self.updated_at = self.clock()

    def apply_event(self, topic: str, body: dict[str, Any]) -> bool:
        """Take one bus event; True when `ps` should be read again."""
        parts = topic.split(".")
        if parts[0] in ("slot", "key"):
            return True
        if parts[0] != "turn" or len(parts) < 3:
            return parts[0] == "supervisor"
        turn_id, event = ".".join(parts[1:-1]), parts[-1]
        ts = _num(body.get("ts")) or self.clock()
        trace = self.turns.get(turn_id)
        if trace is None:
            trace = self.turns[turn_id] = TurnTrace(turn_id)
            self._trim()
        trace.seen_at = self.clock()
        if event in ("stdout", "stderr"):
            trace.output_chunks += 1
            return False
        self._record(trace, topic, ts, body)
        trace.key = _str(body.get("key")) or trace.key
        if body.get("reservation") is True:
            trace.reservation = True
        holder = body.get("holder")
        if isinstance(holder, dict):
            trace.session = _str(holder.get("session")) or trace.session
            trace.agent = _str(holder.get("agent")) or trace.agent
        if event == "queued":
            trace.queued_at = trace.queued_at or ts
        elif event == "granted":
            trace.queued_at = trace.queued_at or ts
            trace.granted_at = ts
            trace.outcome = "running"
        elif event == "adopted":  # a new supervisor took the running turn over
            trace.granted_at = trace.granted_at or trace.queued_at or ts
            trace.outcome = "running"
            trace.adopted_at = ts
            gap = _num(body.get("gap_s"))
            if gap is not None:
                trace.adoption_gap_s = (trace.adoption_gap_s or 0.0) + gap
        elif event == "exited":
            trace.exit = {
                k: v for k, v in body.items() if k not in ("v", "epoch", "seq", "id", "key")
            }
        elif event == "leftovers":
            trace.leftovers = leftovers_of(body)
        elif event in TERMINAL:
            trace.ended_at = ts
            trace.outcome = event
            if event == "released" and trace.granted_at is None:
                trace.granted_at = trace.queued_at  # granted before we subscribed
        self.changed_bars.add(turn_id)
        return event in CHANGES_PS

    def _record(self, trace: TurnTrace, topic: str, ts: float, body: dict[str, Any]) -> None:
        if len(trace.events) >= MAX_EVENTS:
            trace.dropped_events += 1
            return
        shown = {k: v for k, v in body.items() if k not in ("v", "ts")}
        trace.events.append(EventView(topic=topic, ts=ts, body=shown))

    def _trim(self) -> None:
        if len(self.turns) <= MAX_TURNS:
            return
        ended = sorted(
            (t for t in self.turns.values() if t.ended_at is not None),
            key=lambda t: t.ended_at or 0.0,
        )
        for trace in ended[: len(self.turns) - MAX_TURNS]:
            del self.turns[trace.id]

    def expire(self) -> None:
        """Forget turns that ended more than KEEP_SECONDS ago."""
        horizon = self.clock() - KEEP_SECONDS
        for turn_id in [
            t.id for t in self.turns.values() if t.ended_at is not None and t.ended_at < horizon
        ]:
            del self.turns[turn_id]

    # -- out

    def state(self, usage: Usage | None = None) -> StateView:
        usage = usage or {}
        slots = [s for s in self.ps.get("slots", []) if isinstance(s, dict)]
        waits = [w for w in self.ps.get("waits", []) if isinstance(w, dict)]
        keys: dict[str, KeyView] = {}
        # `slot_keys`: each key's slots counted by state (free ones are counted, not listed)
        for tally in self.ps.get("slot_keys", []):
            if not isinstance(tally, dict):
                continue
            key = str(tally.get("key"))
            view = keys[key] = self._key_view(key, _int(tally.get("cap")) or 0)
            for name in _SLOT_STATES:
                view[name] = _int(tally.get(name)) or 0  # type: ignore[literal-required]
        tallied = set(keys)
        for slot in slots:  # a key without a tally (an older supervisor's `ps`): count its slots
            key = str(slot.get("key"))
            if key in tallied:
                continue
            if key not in keys:
                keys[key] = self._key_view(key, _int(slot.get("cap")) or 0)
            counted = slot.get("state")
            if isinstance(counted, str) and counted in _SLOT_STATES:
                keys[key][counted] += 1  # type: ignore[literal-required]
        for wait in waits:
            key = str(wait.get("key"))
            if key not in keys:
                keys[key] = self._key_view(key, 0)
            keys[key]["waiting"] += 1
        entries = self.ps.get("keys")
        for entry in entries if isinstance(entries, list) else []:  # paused, never run: a row too
            if isinstance(entry, dict) and isinstance(entry.get("key"), str) and "cap" in entry:
                name = entry["key"]
                covering = any(k.startswith(name + ":") for k in keys)  # a bare harness name
                if name not in keys and not name.startswith("_") and not covering:
                    keys[name] = self._key_view(name, 0)
        holders = []
        for slot in slots:
            if not isinstance(slot.get("state"), str) or slot["state"] not in TAKEN:
                continue
            holder = _dict(slot.get("holder"))
            turn_id = _str(slot.get("turn"))
            cpu, rss = usage.get(turn_id or "", (None, None))
            tree = _dict(slot.get("usage")).get("mem")  # the whole tree, as its guard sampled it
            rss = tree if isinstance(tree, int) and not isinstance(tree, bool) else rss
            # Adopted: as `ps` says it, else as the bus told (an older ps has no such field)
            trace = self.turns.get(turn_id or "")
            adopted_at = _num(slot.get("adopted_at")) or (trace.adopted_at if trace else None)
            gap = _num(slot.get("adoption_gap_s"))
            if gap is None and trace is not None:
                gap = trace.adoption_gap_s
            holders.append(
                HolderView(
                    key=str(slot.get("key")),
                    index=_int(slot.get("index")) or 0,
                    state=str(slot.get("state")),
                    turn=turn_id,
                    session=_str(holder.get("session")),
                    agent=_str(holder.get("agent")),
                    since=_num(slot.get("since")),
                    pid=_int(slot.get("pid")),
                    cpu_seconds=cpu,
                    rss_bytes=rss,
                    command=_command(slot.get("argv")),
                    cwd=_str(slot.get("cwd")),
                    adopted_at=adopted_at,
                    adoption_gap_s=gap,
                )
            )
        queue = []
        for wait in waits:
            holder = _dict(wait.get("holder"))
            queue.append(
                WaitView(
                    id=str(wait.get("id")),
                    key=str(wait.get("key")),
                    position=_int(wait.get("position")),
                    session=_str(holder.get("session")),
                    agent=_str(holder.get("agent")),
                    since=_num(wait.get("since")),
                    reservation=wait.get("reservation") is True,
                    why=_why(wait.get("why")),
                    why_word=_why_word(wait.get("why")),
                    command=_command(wait.get("argv")),
                    cwd=_str(wait.get("cwd")),
                )
            )
        queue.sort(
            key=lambda w: (w["key"], w["position"] if w["position"] is not None else 1 << 30)
        )
        return StateView(
            keys=[keys[k] for k in sorted(keys)],
            holders=holders,
            waits=queue,
            supervisor=self.status,
            connected=self.connected,
            error=self.error,
            updated_at=self.updated_at,
        )

    def _key_view(self, key: str, cap: int) -> KeyView:
        # A key with no slot tally yet (paused before it ever ran): its cap as `ps` says it.
        cap = cap or _int(self._ps_key_entry(key).get("cap")) or 0
        until, reason = self._pause_of(key)
        return KeyView(
            key=key,
            cap=cap,
            held=0,
            reserved=0,
            orphaned=0,
            unreadable=0,
            free=0,
            waiting=0,
            paused_until=until,
            paused_reason=reason,
            rate=self._rate_of(key),
            next_grant=_num(self._ps_key_entry(key).get("next_grant")),
            quota=[w for w in self._ps_key_entry(key).get("quota") or [] if isinstance(w, dict)],
        )

    def _ps_key_entry(self, key: str, exact: bool = True) -> dict[str, Any]:
        """What `ps` says of a key beyond its slots, in whichever shape it has (or {}); unless
        `exact`, the entry of its harness (a bare name's pause covers its keys) serves too."""
        entries = self.ps.get("keys")
        names = [key] if exact else [key, key.partition(":")[0]]
        for name in names:
            if isinstance(entries, dict) and isinstance(entries.get(name), dict):
                return entries[name]
            if isinstance(entries, list):
                for entry in entries:
                    if isinstance(entry, dict) and entry.get("key") == name:
                        return entry
        return {}

    def _pause_of(self, key: str) -> tuple[float | None, str | None]:
        for source in (self.ps.get("pauses"), self.status.get("pauses")):
            if isinstance(source, dict) and isinstance(source.get(key), dict):
                pause = source[key]
                return _num(pause.get("until")), _str(pause.get("reason"))
        entry = self._ps_key_entry(key, exact=False)
        paused = entry.get("paused")
        if isinstance(paused, dict):
            return _num(paused.get("until")), _str(paused.get("reason"))
        if _num(entry.get("paused_until")) is not None:
            return _num(entry.get("paused_until")), _str(entry.get("paused_reason"))
        return None, None

    def _rate_of(self, key: str) -> str | None:
        entry = self._ps_key_entry(key)
        rate = entry.get("rate")
        if isinstance(rate, str):
            return rate
        if isinstance(rate, dict):
            limit, window = rate.get("limit", rate.get("n")), rate.get("window")
            used = rate.get("used", rate.get("recent"))
            if limit is not None and window is not None:
                shown = f"{limit}/{window}"
                return f"{used} of {shown}" if used is not None else shown
        return None

    def bars(self, since: float) -> list[Bar]:
        """The timeline: every turn seen that was still waiting or running after `since`."""
        out = []
        for trace in self.turns.values():
            if trace.ended_at is not None and trace.ended_at < since:
                continue
            if trace.queued_at is None and trace.granted_at is None and trace.ended_at is None:
                continue
            out.append(trace.bar())
        out.sort(key=lambda b: b["queued_at"] or b["granted_at"] or 0.0)
        return out

    def take_changed_bars(self) -> list[Bar]:
        changed = [self.turns[i].bar() for i in self.changed_bars if i in self.turns]
        self.changed_bars.clear()
        return changed

    def turn(self, turn_id: str) -> TurnView | None:
        trace = self.turns.get(turn_id)
        active = any(s.get("turn") == turn_id for s in self.ps.get("slots", [])) or any(
            w.get("id") == turn_id for w in self.ps.get("waits", [])
        )
        if trace is None:
            if not active:
                return None
            trace = TurnTrace(turn_id)
        usage = None
        if trace.exit is not None:
            usage = trace.exit.get("usage") if isinstance(trace.exit.get("usage"), dict) else None
            if usage is None:  # the figures sit beside the outcome, each named with its unit
                usage = {
                    k: v
                    for k, v in trace.exit.items()
                    if k not in NOT_USAGE and _num(v) is not None
                } or None
        return TurnView(
            id=turn_id,
            key=trace.key,
            bar=trace.bar() if trace.key else None,
            events=list(trace.events),
            output_chunks=trace.output_chunks,
            usage=usage,
            exit=trace.exit,
            leftovers=trace.leftovers,
            # A terminal event is final (ps may be older); between an event and the next `ps`,
            # the event is the newer word.
            active=trace.ended_at is None and (active or trace.seen_at >= self.ps_at),
        )


def leftovers_of(body: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The page's `{"count", "names"}` from a leftovers event or history column (each name with
    `name`, `command`, `pid`, `pgid`, `ran_s`); None when it says nothing."""
    if not body:
        return None
    names = body.get("names")
    return {
        "count": _int(body.get("count")),
        "names": [
            {
                "name": _str(n.get("name")) or _str(n.get("comm")),
                "command": _command(n.get("argv")) or _str(n.get("comm")),
                "pid": _int(n.get("pid")),
                "pgid": _int(n.get("pgid")),
                "ran_s": _num(n.get("ran_s")),
            }
            for n in (names if isinstance(names, list) else [])
            if isinstance(n, dict)
        ],
    }


def _command(argv: Any) -> str | None:
    """A turn's argv as one line a shell reads back (shlex.join); None when not a list of strings."""
    import shlex

    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        return None
    return shlex.join(argv)
