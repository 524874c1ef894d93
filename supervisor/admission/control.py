"""Key control: the daemon's side of admission — pauses and rate windows on the bus, their timers
and their file, runtime deadlines, and `[pause_on.<key>]`.

The decisions are supervisor.admission.policy's (pure); this module applies them in the running
supervisor through the manager's seams: it is the manager's `Admission` (supervisor.turns.manager:
`refusal(item, now)` for the head of each key, before the slot gate), made by the manager with the
manager's `Turns` (the ledger, the settings, `grant_waiters` and `cancel`), so it has all it uses
from its construction on; the wait queue is the ledger's, ordered by `[slots] fairness`
(`ordering`), and `retune` ranks it again. It observes the ledger's events as they are emitted
(it subscribes in its constructor): a grant counts in the key's rate window before the next head is asked, and starts the
stderr watch and the quota readers (a turn's first output may come before its `started`);
`started` sets the runtime deadline; `stderr` chunks go to the pause_on scanner; `exited`
checks pause_on's exit codes; a finished item drops its timers. One timer wakes the grants when a
pause ends or a waiting key's rate window opens. The daemon calls `pause`, `resume`, `restore` and
`retune` for the control commands, the bus and a reload; `views` asks `waits_why` and `keys_view`.

Events: `key.<key>.paused {key, until, reason, by, since, id, changed}` when a pause starts or
lasts longer, and once for each new request id (the answer to a bus `request.pause`);
`key.<key>.resumed {key, reason}` ("expired", or the reason given to resume, "resumed" by
default); `turn.<id>.expiring {id, key, stop_at, limit, source}` before a runtime limit, then the
turn is cancelled with reason "timeout" (its `exited` says `reason: "timeout"`).

A turn whose key has a `pause_on` stderr rule is scanned off the loop (supervisor.admission.pause_on). The
key's next grant waits until what an ended turn wrote has been scanned (`checking_output`, usually
well under a millisecond), so a turn that prints a 429 and exits cannot hand its slot to a waiter
before its pause lands.

State: pauses go to admission.json (supervisor.admission.state) before a pause or resume is
answered; the current rate windows with the round of grants that changed them (at the end of that
turn of the event loop, one write for many grants; a grant's later restamp at its start waits for
the next save or `close`), so a supervisor killed in between forgets at most that round's grants
or a few ms of restamp. `restore` takes the file back at start. Runtime deadlines are not saved: a restarted
supervisor does not run the old turns (their guards end with it).
Knows timers, events and the file; nothing of slots or sockets.

Size: past 600 lines and still one concept, admission as the running supervisor applies it: each
hold (pauses, rates, quota windows, runtime limits, pause_on, the room) is a module of its own in
supervisor.admission, and what stays here is how their timers, events and file meet the manager.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import TypedDict, cast

from ..config.admission import AdmissionSettings, PauseRule
from ..turns.fairness import make_ordering
from ..turns.manager import Refusal, Turns
from ..turns.seams import LoopTimers, Timer, Timers
from ..turns.states import Item, State, Turn
from ..wire.args import PauseArgs, ResumeArgs
from ..wire.protocol import output_bytes
from . import state as admission_state
from .pause_on import PauseRules, StderrScanner
from .pauses import PauseBook, PauseJSON
from .policy import Admission, WaitReason, Why, WhyJSON, gate_why, quota_why
from .quota import QuotaBook, ReadingError, Window, WindowJSON
from .quota_readers import QuotaReaders, codex_home
from .quota_signals import Reading
from .rates import RateTable, StartWindows
from .room import MachineRoom
from .runtime_limits import RuntimeLimits

# A started turn's command runs a few milliseconds after its guard started (exec, the program's
# own start): its grant is counted from its start plus this, so the starts the commands themselves
# see keep the rate too, unless one lags its guard by more (a machine under heavy load).
START_SLACK = 0.05

_GATE_WORDS = ("key_full", "machine_full", "low_memory", "unreadable")  # SlotGate.last_refusal
_REASONS = frozenset(r.value for r in WaitReason)

log = logging.getLogger("ccsup.keyctl")


def admission_settings(config: object) -> AdmissionSettings:
    """The config's admission settings (`Config.admission`), else the defaults."""
    settings = getattr(config, "admission", None)
    return settings if isinstance(settings, AdmissionSettings) else AdmissionSettings()


class KeyViewJSON(TypedDict):
    key: str
    paused: PauseJSON | None
    quota: list[WindowJSON]  # the key's provider windows not yet reset
    next_grant: float | None  # when the rate window lets the next grant through (None: now)
    waiting: WhyJSON | None  # why the key's head waits


class KeyControl:
    def __init__(
        self,
        settings: AdmissionSettings,
        state_dir: Path,
        turns: Turns,
        *,
        publish: Callable[[str, dict], None],
        clock: Callable[[], float],
        timers: Timers | None = None,
        room: MachineRoom | None = None,
    ):
        """`turns`: the manager (supervisor.turns.manager.Turns); `room`: `[memory]`'s machine
        room (supervisor.admission.room), asked last, after the pauses and windows."""
        self.settings = settings
        self.path = admission_state.path_in(state_dir)
        self.publish = publish  # key.* events
        self.clock = clock
        self.timers: Timers = (
            timers or LoopTimers()
        )  # a test gives its own (supervisor.turns.seams)
        self.turns = turns  # grant_waiters and cancel, at run time
        ledger = turns.ledger
        self.emit = ledger.emit  # turn.<id>.*, in order with the ledger's
        self.lookup = ledger.get
        self.queue = ledger.queue  # ordered by [slots] fairness; retune reorders it
        self.files = ledger.files  # admission.json's fsyncs, off the event loop
        self.room = room
        self.policy = Admission(
            PauseBook(settings.max_pause),
            StartWindows(RateTable(settings.rates)),
            QuotaBook(),
            settings.hold_at,
        )
        # Told of every window taken or cleared here (the cluster shares them through etcd).
        self.quota_observers: list[Callable[[str, list[Window]], None]] = []
        self.limits = RuntimeLimits(settings.max_runtime, settings.expiring_notice)
        self.rules = PauseRules(settings.pause_on)
        self._scanner: StderrScanner | None = None
        self.readers: QuotaReaders | None = None  # the harnesses' own signals, made at first use
        self._homes: dict[str, Path] = {}  # granted turn -> its CODEX_HOME, until it starts
        self._checking: Counter[str] = Counter()  # key -> ended turns whose stderr is unscanned
        self._wake: Timer | None = None
        self._wake_at: float | None = None
        self._deadlines: dict[str, Timer] = {}
        self._paused_by_turn: set[str] = set()
        self._granted_at: dict[str, float] = {}  # rate-limited grants not yet started
        self._dirty = False  # admission.json is behind memory (see _save_soon)
        self._save_pending = False
        ledger.observers.append(self._observe)
        ledger.on_finished.append(lambda item: self._finished(item.id))

    def grant(self) -> None:
        """The manager's grant round: heads held here are asked again."""
        self.turns.grant_waiters()

    def key_env(self, key: str) -> Mapping[str, str]:
        """`[env."<key>"]` as the manager has it now (a reload changes it)."""
        return self.turns.settings.key_env.get(key, {})

    # -- the manager's Admission (supervisor.turns.manager) ------------------------------------------

    def refusal(self, item: Item, now: float, key: str | None = None) -> Refusal | None:
        """`key`: a pool's member the item would be granted on (default: its own key)."""
        key = key or item.key
        why = self.hold(key, now)
        if why is not None and self.room is not None:
            self.room.held.pop(item.id, None)  # held for time: it keeps nobody from the room
        if why is None and self.room is not None:
            why = self.room.hold(item, now, key)  # memory room and pressure: the last hold asked
            if why is not None:
                self.policy.note(key, why)
        if why is None:
            return None
        if why.until is not None:
            self._arm(why.until)  # the head is asked again when its hold ends
        return Refusal(why.reason.value, why.until)

    def _observe(self, topic: str, body: dict) -> None:
        """Every event the ledger emits (subscribed in the constructor): quick, never emits itself."""
        parts = topic.split(".")
        if len(parts) != 3 or parts[0] != "turn":
            return
        kind = parts[2]
        if kind in ("stdout", "stderr"):
            scanner = self._scanner if kind == "stderr" else None
            readers = self.readers
            if scanner is None and (readers is None or not readers.reading(parts[1])):
                return
            text = body.get("data")  # UTF-8 text, else the exact bytes as data_b64
            data = text.encode() if isinstance(text, str) else output_bytes(body)[1]
            if scanner is not None:
                scanner.feed(parts[1], data)
            if readers is not None:
                readers.output(parts[1], kind, data)
            return
        if kind not in ("granted", "started", "exited", "adopted"):
            return
        item = self.lookup(parts[1])
        if kind == "granted" and isinstance(item, Turn) and self.settings.quota_read:
            # The turn's environment is the guard's once it starts: where its Codex keeps its
            # session files is taken now (supervisor.admission.quota_readers).
            # A pool's turn: its member's [env] (CODEX_HOME) comes after the caller's.
            env = {**item.env, **self.key_env(item.slot_key)}
            self._homes[item.id] = codex_home(env, item.env_replace, item.cwd)
            self._read_turn(item)  # from its grant: its first output may come before `started`
        if kind == "granted" and isinstance(item, Turn):
            self._watch_stderr(item)  # from its grant, as its quota signals are
        if kind == "granted" and item is not None:
            if isinstance(body.get("reservation"), str):
                return  # a turn binding a held reservation: that grant was counted already
            member = body.get("member")  # a pool's turn counts in its member's rate window
            self.granted(member if isinstance(member, str) else item.key, item.id)
            self.queue.ordering.granted(item.id)
        elif isinstance(item, Turn) and kind == "started":
            self.turn_started(item)
        elif isinstance(item, Turn) and kind == "adopted":
            # Its runtime limit counts from its guard's start: past it, it is stopped at once.
            started_at = body.get("started_at")
            self.turn_started(item, started_at if isinstance(started_at, float) else None)
        elif isinstance(item, Turn):
            self.turn_exited(item)  # before its release: the key's next grant waits for pause_on

    def _finished(self, item_id: str) -> None:
        if self.readers is not None:
            self.readers.turn_ended(item_id)  # one that ended with no exit (a lost guard)
        if self._scanner is not None:
            self._scanner.forget(item_id)  # one granted that never ran to an exit
        self.queue.ordering.removed(item_id)
        self.turn_finished(item_id)

    # -- commands --------------------------------------------------------------------------------

    def pause(self, args: PauseArgs, by: str | None = None, *, refine: bool = False) -> dict:
        now = self.clock()
        answer = self.policy.pauses.pause(
            args.key,
            args.end(now),
            now,
            reason=args.reason,
            by=args.by or by,
            request_id=args.id,
            refine=refine,
        )
        if answer.changed:
            self._save()
            log.info("key %s paused until %.3f (%s)", args.key, answer.pause.until, args.reason)
            self._arm()
        if answer.changed or (args.id is not None and not answer.repeat):
            # A bus request is answered by this event (once per id), even when the key was
            # already paused longer: it then says until when.
            body = {**answer.pause.to_json(), "id": args.id, "changed": answer.changed}
            self.publish(f"key.{args.key}.paused", body)
        return {
            **answer.pause.to_json(),
            "changed": answer.changed,
            "capped": answer.capped,
            "max_pause": self.settings.max_pause,
            "id": args.id,
        }

    def resume(self, args: ResumeArgs) -> dict:
        ended = self.policy.pauses.resume(args.key)
        reason = args.reason or "resumed"
        if ended:
            self._save()
            for pause in ended:
                self.publish(f"key.{pause.key}.resumed", {"key": pause.key, "reason": reason})
            self._arm()
            self.grant()
        still = self.policy.pauses.covering(args.key, self.clock())
        return {
            "key": args.key,
            "resumed": [p.key for p in ended],
            "still_paused": still.to_json() if still else None,
        }

    def restore(self) -> list[str]:
        """Take back admission.json (call before the first grant). Returns the problems found."""
        data, problem = admission_state.load(self.path)
        now = self.clock()
        problems = [problem] if problem else []
        problems += self.policy.pauses.from_json(data["pauses"], now)
        problems += self.policy.starts.from_json(data["starts"], now)
        problems += self.policy.quota.from_json(data["quota"], now)
        self._save()  # what ended meanwhile is gone from the file too
        self._arm()
        return problems

    def retune(self, settings: AdmissionSettings) -> None:
        """A reload: new rates, limits, rules, fairness and max_pause (live pauses keep their
        ends; the waiters are ranked again, in their current order, by a new fairness)."""
        if settings.fairness != self.settings.fairness:
            self.queue.reorder(make_ordering(settings.fairness))
        self.settings = settings
        self.policy.pauses.max_pause = settings.max_pause
        self.policy.hold_at = settings.hold_at
        if self.readers is not None:
            self.readers.read = settings.quota_read
        self.policy.starts.retune(RateTable(settings.rates))
        self.limits = RuntimeLimits(settings.max_runtime, settings.expiring_notice)
        self.rules = PauseRules(settings.pause_on)
        self._arm()

    def paused_keys(self) -> list[PauseJSON]:
        return [p.to_json() for p in self.policy.pauses.active(self.clock())]

    def keys_view(self, keys: list[str], refused: Mapping[str, Refusal]) -> list[KeyViewJSON]:
        """Every key that is paused, rate-held or has waiters (`keys`), for ps and status;
        `refused` is the manager's last refusal of each key's head."""
        now = self.clock()
        names = set(keys) | {p.key for p in self.policy.pauses.active(now)}
        names |= {
            k for k in self.policy.starts.to_json() if self.policy.starts.next_allowed(k, now)
        }
        names |= set(self.policy.quota.keys(now))
        view: list[KeyViewJSON] = []
        for key in sorted(names):
            pause = self.policy.pauses.covering(key, now)
            view.append(
                {
                    "key": key,
                    "paused": pause.to_json() if pause else None,
                    "quota": [w.to_json() for w in self.policy.quota.windows(key, now)],
                    "next_grant": self.policy.starts.next_allowed(key, now),
                    "waiting": self.waits_why(key, 1, refused.get(key)) if key in keys else None,
                }
            )
        return view

    # -- provider windows (supervisor.admission.quota) ------------------------------------------

    def quota_room(self, key: str) -> bool:
        """Whether `key` has quota room now: no window at or past `[quota] hold_at`."""
        return self.policy.quota_hold(key, self.clock()) is None

    def quota_hold(self, key: str) -> Why | None:
        """Why `key` is held for quota now (its window, use and reset), or None."""
        window = self.policy.quota_hold(key, self.clock())
        return quota_why(window) if window is not None else None

    def quota_set(
        self,
        key: str,
        window: object,
        used: object,
        resets_at: object,
        *,
        source: str,
        request_id: str | None = None,
    ) -> dict:
        """Take a reading of one of `key`'s windows. ReadingError (naming the field) when it
        cannot be one: nothing changes. Announced as `key.<key>.quota` (the answer to a bus
        `request.quota`: once per id, even when nothing changed)."""
        now = self.clock()
        answer = self.policy.quota.record(
            key, window, used, resets_at, now, source=source, request_id=request_id
        )
        if answer.repeat or (not answer.changed and request_id is None):
            # A repeat of a known id, or a reader saying again what it said: nothing new.
            return self._quota_answer(answer.key, request_id, changed=False, now=now)
        if answer.changed:
            log.info(
                "key %s window %s: %.3f used, resets at %.0f (%s)",
                key,
                window,
                used,
                resets_at,
                source,
            )
        self._quota_changed(key, now, announce=False)
        result = self._quota_answer(key, request_id, changed=answer.changed, now=now)
        self.publish(f"key.{key}.quota", result)
        return result

    def quota_clear(
        self, key: str, window: str | None = None, *, source: str = "cli", share: bool = True
    ) -> dict:
        """Forget `key`'s windows (or the one named): its grants are no longer held for them.
        `share`: tell the quota observers (False for a clear that came from the cluster)."""
        now = self.clock()
        gone = self.policy.quota.clear(key, window)
        if not gone and not share:
            return self._quota_answer(key, None, changed=False, now=now)
        self._quota_changed(key, now, announce=bool(gone), share=share, reason="cleared")
        return {
            **self._quota_answer(key, None, changed=bool(gone), now=now),
            "cleared": [w.window for w in gone],
        }

    def quota_merge(self, key: str, windows: list[Window]) -> None:
        """Windows read on another machine (supervisor.cluster): taken when newer than ours."""
        now = self.clock()
        if any([self.policy.quota.merge(key, w, now) for w in windows]):
            self._quota_changed(key, now, announce=True, share=False, reason="cluster")

    def quota_view(self, key: str | None = None) -> dict:
        """`ccsup quota [KEY]`: each key's windows, and whether it is held."""
        now = self.clock()
        keys = [key] if key is not None else self.policy.quota.keys(now)
        return {
            "hold_at": self.policy.hold_at,
            "skipped": self.policy.quota.skipped,
            "keys": [self._quota_answer(k, None, changed=False, now=now) for k in keys],
        }

    def _quota_read(self, key: str, reading: Reading) -> None:
        """A reading of a harness's own signal (supervisor.admission.quota_readers)."""
        try:
            self.quota_set(
                key, reading.window, reading.used, reading.resets_at, source=reading.source
            )
        except ReadingError as e:
            self._quota_unreadable(f"{key} {reading.source}: {e}")

    def quota_skipped(self) -> None:
        """A window from elsewhere that could not be read (counted in `quota`'s `skipped`)."""
        self.policy.quota.skipped += 1

    def _quota_unreadable(self, what: str) -> None:
        """A reader met a payload or reading it could not take (counted, never fatal)."""
        self.policy.quota.skipped += 1
        log.info("quota reading skipped: %s", what)

    def _quota_answer(self, key: str, request_id: str | None, *, changed: bool, now: float) -> dict:
        held = self.policy.quota_hold(key, now)
        return {
            "key": key,
            "id": request_id,
            "windows": [w.to_json() for w in self.policy.quota.windows(key, now)],
            "held": held.to_json() if held is not None else None,
            "hold_at": self.policy.hold_at,
            "changed": changed,
        }

    def _quota_changed(
        self,
        key: str,
        now: float,
        *,
        announce: bool,
        share: bool = True,
        reason: str | None = None,
    ) -> None:
        self._save()
        if share:
            windows = self.policy.quota.windows(key, now)
            for observer in self.quota_observers:
                observer(key, windows)
        if announce:
            body = self._quota_answer(key, None, changed=True, now=now)
            self.publish(f"key.{key}.quota", {**body, "reason": reason})
        self._arm()
        self.grant()  # a window below hold_at, or gone, frees the key's waiters now

    def close(self) -> None:
        if self._dirty:
            self._save()
        if self._wake is not None:
            self._wake.cancel()
        for timer in self._deadlines.values():
            timer.cancel()
        self._deadlines.clear()
        if self._scanner is not None:
            self._scanner.close()
        if self.readers is not None:
            self.readers.close()

    # -- hooks of the grant ----------------------------------------------------------------------

    def hold(self, key: str, now: float) -> Why | None:
        """Why the head of `key` may not be granted at `now` (None: ask the gate)."""
        if self._checking[key]:
            detail = "the output of an ended turn is being read (pause_on, quota)"
            return self.policy.note(key, Why(WaitReason.CHECKING_OUTPUT, None, detail))
        return self.policy.hold(key, now)

    def granted(self, key: str, item_id: str) -> None:
        now = self.clock()
        self.policy.granted(key, now)
        if self.policy.starts.table.rate_for(key) is not None:
            self._granted_at[item_id] = now
            self._save_soon()  # the grants of the current window survive a restart

    def waits_why(self, key: str, position: int | None, gate: Refusal | None) -> WhyJSON | None:
        """Why a waiter of `key` at `position` waits; `gate` is the manager's last refusal of the
        key's head (the gate's word, or one of this policy's holds). Changes nothing."""
        if gate is None:
            head = None  # not refused at the last round: it is being granted
        elif gate.detail and gate.reason in _REASONS:  # a pool: its members' refusals
            head = Why(WaitReason(gate.reason), gate.until, gate.detail)
        elif gate.reason in _GATE_WORDS:
            head = gate_why(gate.reason)
        else:
            head = self.policy.why(key)
        if position is not None and position > 1:
            return self.policy.behind(key, position, head).to_json()
        return head.to_json() if head else None

    # -- timers ----------------------------------------------------------------------------------

    def _arm(self, hold_ends: float | None = None) -> None:
        """One timer for the next moment something may change: a pause ends (to announce it),
        or the hold of a refused head ends (`hold_ends`: its pause or rate window). A timer set
        for a later moment is brought forward, never put off."""
        now = self.clock()
        times = [self.policy.pauses.next_expiry(), self.policy.quota.next_reset(), hold_ends]
        if self._wake is not None:
            times.append(self._wake_at)
        at = min((t for t in times if t is not None), default=None)
        if at == self._wake_at and self._wake is not None:
            return
        if self._wake is not None:
            self._wake.cancel()
            self._wake = None
        self._wake_at = at
        if at is not None:
            self._wake = self.timers.call_later(max(at - now, 0.0), self._on_wake)

    def _on_wake(self) -> None:
        self._wake = None
        self._wake_at = None
        ended = self.policy.pauses.expire(self.clock())
        if ended:
            self._save()
            for pause in ended:
                self.publish(f"key.{pause.key}.resumed", {"key": pause.key, "reason": "expired"})
        self.policy.starts.forget_old(self.clock())
        reset = self.policy.quota.expire(self.clock())
        if reset:
            self._save()
            for key in sorted({key for key, _ in reset}):
                body = self._quota_answer(key, None, changed=True, now=self.clock())
                self.publish(f"key.{key}.quota", {**body, "reason": "reset"})
        self.grant()  # a head still held is refused again, which arms its own wake
        self._arm()

    def _save_soon(self) -> None:
        """Save at the end of this turn of the event loop: one write for a round of grants."""
        self._dirty = True
        if not self._save_pending:
            self._save_pending = True
            self.timers.call_later(0.0, self._save_if_dirty)

    def _save_if_dirty(self) -> None:
        self._save_pending = False
        if self._dirty:
            self._save()

    def _save(self) -> None:
        """Now (a pause is saved before it is answered: nothing acknowledged is lost)."""
        self._dirty = False
        try:
            admission_state.save(
                self.path,
                pauses=self.policy.pauses.to_json(),
                starts=self.policy.starts.to_json(),
                quota=self.policy.quota.to_json(),
                sync=False,
            )
            self.files.sync_soon(self.path)
        except OSError as e:
            log.error("unable to save %s: %s (kept in memory)", self.path, e.strerror)

    # -- a turn's life ---------------------------------------------------------------------------

    def turn_started(self, turn: Turn, started_at: float | None = None) -> None:
        """started_at: an adopted turn's guard's start (supervisor.turns.adopt); default now."""
        now = self.clock()
        granted_at = self._granted_at.pop(turn.id, None)
        if granted_at is not None:  # the rate window counts from when the work started
            self.policy.starts.restamp(turn.slot_key, granted_at, now + START_SLACK)
            self._dirty = True  # saved with the next grant's save, or at close
            held = self.policy.why(turn.slot_key)
            if held is not None and held.reason is WaitReason.RATE:
                # its head's hold moved with the window: `ps` says the new end, as `keys` does
                self.policy.hold(turn.slot_key, now)
        deadline = self.limits.deadline(turn.slot_key, turn.timeout, started_at or now)
        if deadline is not None:

            def warn() -> None:
                self._expiring(turn, deadline.stop_at, deadline.limit, deadline.source)

            self._deadlines[turn.id] = self.timers.call_later(
                max(deadline.warn_at - now, 0.0), warn
            )
        self._read_turn(turn)  # an adopted one (a granted one is read from its grant)
        self._watch_stderr(turn)

    def _watch_stderr(self, turn: Turn) -> None:
        """Scan the turn's stderr for its key's pause_on pattern, if it has one: from its grant,
        since its first output may come before `started`; from its adoption for an adopted one."""
        rule = self.rules.rule_for(turn.slot_key)
        if rule is not None and rule.stderr is not None:
            if self._scanner is None:
                loop = asyncio.get_running_loop()
                self._scanner = StderrScanner(
                    self._stderr_matched, self._stderr_done, loop.call_soon_threadsafe
                )
            self._scanner.watch(turn.id, rule.stderr, (turn.slot_key, rule))

    def _read_turn(self, turn: Turn) -> None:
        """Read the harness's own signals in the turn's output, if its harness is read."""
        if not self.settings.quota_read:
            return
        if turn.slot_key.partition(":")[0] not in self.settings.quota_read:
            return
        if self.readers is None and _running_loop():
            self.readers = QuotaReaders(
                self.settings.quota_read,
                self._quota_read,
                self._quota_unreadable,
                asyncio.get_running_loop().call_soon_threadsafe,
            )
        if self.readers is not None and not self.readers.reading(turn.id):
            home = self._homes.pop(turn.id, None) or codex_home({}, False, turn.cwd)
            # a pool's turn: what it reads is its member's (the account it ran on)
            self.readers.turn_started(turn.id, turn.slot_key, home)

    def _expiring(self, turn: Turn, stop_at: float, limit: float, source: str) -> None:
        if turn.state is not State.RUNNING:
            return
        self.emit(
            f"turn.{turn.id}.expiring",
            {"id": turn.id, "key": turn.key, "stop_at": stop_at, "limit": limit, "source": source},
        )
        self._deadlines[turn.id] = self.timers.call_later(
            max(stop_at - self.clock(), 0.0), partial(self._time_up, turn)
        )

    def _time_up(self, turn: Turn) -> None:
        self._deadlines.pop(turn.id, None)
        if turn.state is State.RUNNING:
            log.info("turn %s ran past its limit: stopping it", turn.id)
            self.turns.cancel(turn.id, reason="timeout")

    def turn_exited(self, turn: Turn) -> None:
        if self._scanner is not None and self._scanner.finish(turn.id):
            self._checking[turn.slot_key] += 1
        if self.readers is not None and self.readers.reading(turn.id):
            # Its last lines and records are read before the key's next grant (a 429 read).
            self._checking[turn.slot_key] += 1
            self.readers.turn_ended(turn.id, partial(self._read_done, turn.slot_key))
        rule = self.rules.rule_for(turn.slot_key)
        code = turn.exit["code"] if turn.exit is not None else None
        if rule is not None and code in rule.exit_codes:
            self._pause_for(turn.id, turn.slot_key, rule, None, f"exit code {code}")

    def turn_finished(self, item_id: str) -> None:
        self._homes.pop(item_id, None)
        self._paused_by_turn.discard(item_id)
        self._granted_at.pop(item_id, None)
        timer = self._deadlines.pop(item_id, None)
        if timer is not None:
            timer.cancel()

    def _stderr_matched(
        self, turn_id: str, context: object, seconds: float | None, refine: bool
    ) -> None:
        key, rule = cast(tuple[str, PauseRule], context)
        if refine and seconds:  # the Retry-After came after the line that paused the key
            reason = f"pause_on: stderr matched (Retry-After: {seconds:g})"
            by = f"pause_on:{turn_id}"
            self.pause(PauseArgs(None, key, seconds, None, reason, by), refine=True)
        elif not refine:
            self._pause_for(turn_id, key, rule, seconds, "stderr matched")

    def _read_done(self, key: str) -> None:
        self._checking[key] -= 1
        if self._checking[key] <= 0:
            del self._checking[key]
            self.grant()

    def _stderr_done(self, turn_id: str, context: object) -> None:
        key, _ = cast(tuple[str, PauseRule], context)
        self._paused_by_turn.discard(turn_id)
        self._checking[key] -= 1
        if self._checking[key] <= 0:
            del self._checking[key]
            self.grant()

    def _pause_for(
        self, turn_id: str, key: str, rule: PauseRule, seconds: float | None, what: str
    ) -> None:
        if turn_id in self._paused_by_turn:
            return  # a turn pauses its key once
        self._paused_by_turn.add(turn_id)
        length = seconds if seconds is not None and seconds > 0 else rule.for_
        reason = f"pause_on: {what}" + (f" (Retry-After: {seconds:g})" if seconds else "")
        self.pause(PauseArgs(None, key, length, None, reason, f"pause_on:{turn_id}"))


def _running_loop() -> bool:
    """Whether an event loop runs here (the readers post to it; a logic test has none)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
