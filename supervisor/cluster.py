"""The cluster gate: caps that hold across every supervisor of a cluster, kept in etcd v3.

What it knows: one lease per supervisor, one etcd key per waiting or held turn of a cluster key,
the cluster cap of each key, fencing, and the dead-man deadline file its guards read. What it does
not know: local slots, guards, turn states (the manager asks it `try_take` before a grant and
tells it `release` after a confirmed gone; it tells the manager `stop_turn` and `wake`).

Design note.
- A turn of a cluster key joins the cluster queue when it is queued here: the key
  `<prefix>/q/<key>/<machine>/<turn>`, put under this supervisor's lease. It may be granted when
  its key is among the first `cap` keys under `<prefix>/q/<key>/` sorted by create revision (one
  range with sort and limit: etcd's count ignores revision filters). The create revision is a
  global ticket: FIFO across machines. A machine's places serve its own waiters in its own order
  (a waiter may take its machine's first place in exchange for its own key: `_swap`), so a local
  order that differs from the keys' (a fairness policy, puts finishing out of order) never leaves
  a place unused and never takes a second one. A key is deleted only when the manager says its
  turn's work is confirmed gone (or it stopped waiting), in a txn that checks the key still has
  our lease and our create revision.
- One watch on `<prefix>/`, from the revision of the last read, tells of every release, every cap
  change and every key of ours that vanished (a revoked or expired lease); there is no polling.
  A broken watch is opened again from the last revision it delivered, so nothing is missed.
- Fencing. The lease deadline D = the send time of the last keep-alive that etcd answered + the
  TTL it answered with, on CLOCK_BOOTTIME (which counts suspend). etcd's own expiry is measured
  from when the leader received that keep-alive, so it is never earlier than D (up to the rates
  of the two clocks). Turns must be gone before D: at D - grace - FENCE_MARGIN this supervisor
  stops every held turn and grants nothing until a renewal succeeds; its guards read the same
  moment from the dead-man deadline file, pushed forward at every renewal by the keep-alive
  thread, and stop their turns on their own when it stops moving (a frozen or dead supervisor).
  Past D - KILL_MARGIN a guard kills without a grace.
- A lease that etcd no longer knows (its keep-alive answers without a TTL) fences at once; a new
  lease is granted and the turns still waiting join again (they lose their place: their old keys
  died with the old lease).
- Blocking HTTP never runs on the event loop: the keep-alive and the watch each have a thread of
  their own; every other call runs in a small thread pool. Threads only post results to the loop;
  every decision is made on the loop.

State: nothing on this machine but the deadline file (rewritten at every renewal). A supervisor
that stops half-way (SIGKILL) leaves its keys under its lease: they vanish with the lease, a TTL
later, and its guards end their work when their parent or their deadline goes, before D. A
restarted supervisor has a new lease and joins its waiting turns again (new revisions). Keys of a
machine with the same name and another lease are another incarnation's: never touched here.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypedDict

from guardd import deadman

from .cluster_settings import FENCE_MARGIN, ClusterSettings
from .errors import ConfigError
from .etcd import (
    EtcdClient,
    EtcdError,
    KeyValue,
    WatchBatch,
    compare_create,
    compare_lease,
    op_delete,
    op_get,
    op_put,
    txn_range_kvs,
)

log = logging.getLogger("ccsup.cluster")

KILL_MARGIN = 0.25  # past D - KILL_MARGIN a guard kills at once: SIGKILL takes effect in ms
RETRY = 0.25  # seconds between attempts while etcd does not answer

EntryState = Literal["joining", "waiting", "ready", "held", "leaving"]


class ClusterEntry(TypedDict):
    machine: str
    turn: str
    holder: dict[str, Any]
    since: float
    revision: int


class ClusterKeyView(TypedDict):
    key: str
    cap: int
    holders: list[ClusterEntry]
    waiting: list[ClusterEntry]  # every machine's, in cluster order
    local_waiters: list[dict[str, Any]]  # this machine's: {turn, position}


class ClusterStatus(TypedDict):
    name: str
    prefix: str
    etcd: list[str]
    connected: bool
    fenced: bool
    lease: str | None
    lease_ttl: float
    deadline_in: float | None  # seconds left to the lease deadline D, on this machine's clock
    members: list[dict[str, Any]]
    caps: dict[str, int]


@dataclass
class _Entry:
    key: str
    turn: str
    qkey: str
    holder: dict[str, Any]
    state: EntryState = "joining"
    revision: int = 0  # the create revision of our key; 0 until it is put
    lease: int = 0
    stopped: bool = False
    putting: bool = False
    since: float = field(default_factory=time.time)


def _caps_from(kvs: list[KeyValue], cap_prefix: str) -> dict[str, int]:
    caps = {}
    for kv in kvs:
        value = _cap_value(kv.value)
        if value is not None:
            caps[kv.key[len(cap_prefix) :]] = value
    return caps


def _cap_value(raw: bytes) -> int | None:
    try:
        value = int(raw.decode())
    except (UnicodeDecodeError, ValueError):
        return None
    return value if value >= 1 else None


class ClusterGate:
    """See the module docstring. Every public method runs on the event loop."""

    def __init__(
        self,
        settings: ClusterSettings,
        *,
        deadline_file: Path,
        grace: float,
        publish: Callable[[str, dict], None],
        wake: Callable[[], None],
        stop_turn: Callable[[str, str], None],
        client: EtcdClient | None = None,
    ):
        self.settings = settings
        self.name = settings.name
        self.deadline_file = deadline_file
        self.grace = grace
        self.publish = publish
        self.wake = wake
        self.stop_turn = stop_turn
        self.client = client or EtcdClient(settings.etcd_settings())
        self.q_prefix = f"{settings.prefix}/q/"
        self.cap_prefix = f"{settings.prefix}/cap/"
        self.caps = dict(settings.caps)  # configured; written to etcd at start and reload
        self.stored_caps: dict[str, int] = {}  # as etcd has them (what grants go by)
        self.entries: dict[str, _Entry] = {}  # by turn id
        self.lease = 0
        self.lease_ttl = 0
        self.deadline = 0.0  # D, boottime seconds; 0 while no lease
        self.connected = False
        self.fenced = False
        self.lost = False
        self.closing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="ccsup-etcd")
        self._stop = threading.Event()
        self._nudge = threading.Event()  # renew now (or stop): wakes the keep-alive thread
        self._keeper: threading.Thread | None = None
        self._watch: Any = None  # the open etcd.Watch
        self._watcher: threading.Thread | None = None
        self._watch_from = 0  # the revision a new watch starts at
        self._watch_generation = 0
        self._watch_opening = False
        self._dirty: set[str] = set()
        self._evaluating: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self._fence_timer: asyncio.TimerHandle | None = None
        self._aliases: dict[str, str] = {}  # a bound reservation's id -> its turn's (rebind)
        self._by_qkey: dict[str, _Entry] = {}  # our etcd keys -> their entries (see _swap)
        self._caps_written = False

    # --- life -------------------------------------------------------------------------------

    def start(self) -> None:
        """Begin: the keep-alive thread grants a lease; the rest follows from its answers."""
        self._loop = asyncio.get_running_loop()
        self._keeper = threading.Thread(target=self._keep_alive, name="ccsup-lease", daemon=True)
        self._keeper.start()

    async def close(self, revoke: bool = True) -> None:
        """Stop the threads; revoke the lease (its keys go at once) unless told not to."""
        self.closing = True
        self._stop.set()
        self._nudge.set()
        if self._fence_timer is not None:
            self._fence_timer.cancel()
        if self._watch is not None:
            self._watch.close()
        for task in list(self._tasks):
            task.cancel()
        if self._keeper is not None:
            await asyncio.to_thread(self._keeper.join, 5)
        if revoke and self.lease:
            lease = self.lease
            with contextlib.suppress(EtcdError):
                await self._run(self.client.lease_revoke, lease, 1.0)
        self._pool.shutdown(wait=False, cancel_futures=True)

    # --- what the manager calls -------------------------------------------------------------

    def is_cluster_key(self, key: str) -> bool:
        return self.settings.is_cluster_key(key)

    def cap_of(self, key: str) -> int:
        """The cluster cap grants go by: etcd's value for the key or its harness, else ours."""
        entry = self.settings.cap_entry(key)
        for name in (key, entry):
            if name is not None and name in self.stored_caps:
                return self.stored_caps[name]
        return self.caps.get(entry or key, 1)

    def join(self, key: str, turn: str, holder: dict[str, Any] | None = None) -> None:
        """A turn of a cluster key is queued: its key joins the cluster queue."""
        if turn in self.entries:
            return
        entry = _Entry(key, turn, f"{self.q_prefix}{key}/{self.name}/{turn}", holder or {})
        self.entries[turn] = entry
        self._by_qkey[entry.qkey] = entry
        self._spawn(self._put(entry))

    def try_take(self, key: str, turn: str) -> bool:
        """May this turn be granted now? True once: the entry is held from then on.

        A machine's places in a key's cluster queue serve its own waiters in its own order: when
        this turn's key is not among the first `cap` but another waiting turn of this machine's
        is, this turn takes that key and gives its own in exchange (the cluster sees the same
        keys). So a local order that differs from the order the keys were created (puts that
        finished out of order, a fairness policy, a restored queue) never leaves a place unused.
        """
        entry = self.entries.get(turn)
        if entry is None:
            self.join(key, turn)
            entry = self.entries[turn]
        if not self.may_grant() or entry.state not in ("ready", "waiting", "joining"):
            return False
        if entry.state != "ready":
            if entry.putting:
                return False
            other = next(
                (e for e in self.entries.values() if e.key == key and e.state == "ready"), None
            )
            if other is None:
                return False
            self._swap(entry, other)
        entry.state = "held"
        entry.since = time.time()
        return True

    def _swap(self, entry: _Entry, ready: _Entry) -> None:
        """entry takes ready's key (a first-`cap` one); ready gets entry's key and state."""
        entry.qkey, ready.qkey = ready.qkey, entry.qkey
        entry.revision, ready.revision = ready.revision, entry.revision
        entry.lease, ready.lease = ready.lease, entry.lease
        previous = entry.state
        entry.state, ready.state = "ready", previous
        self._by_qkey[entry.qkey] = entry
        self._by_qkey[ready.qkey] = ready
        if previous == "joining":
            self._spawn(self._put(ready))

    def rebind(self, old: str, new: str) -> None:
        """A turn took a reservation's place (waiting) or its slot (held): the cluster entry is
        the turn's from now on, under the same etcd key; the old id still releases it."""
        entry = self.entries.pop(old, None)
        if entry is None:
            return
        dup = self.entries.get(new)
        if dup is not None:  # the turn's own `queued` came first (a held reservation): not needed
            dup.state = "leaving"
            if dup.revision:
                self._spawn(self._delete(dup))
        entry.turn = new
        self.entries[new] = entry
        self._aliases[old] = new

    def give_back(self, turn: str) -> None:
        """try_take said yes but the grant did not happen (no local slot): keep the place."""
        entry = self.entries.get(turn)
        if entry is not None and entry.state == "held" and not entry.stopped:
            entry.state = "ready"

    def leave(self, turn: str) -> None:
        """The turn stopped waiting (cancelled, rejected): its key goes, unless it is held (then
        release() comes after its work is confirmed gone)."""
        entry = self.entries.get(turn)
        if entry is not None and entry.state != "held":
            self.release(turn)
        self._aliases.pop(turn, None)

    def release(self, turn: str) -> None:
        """The turn's work is confirmed gone (or it stopped waiting): its key may go."""
        entry = self.entries.get(self._aliases.pop(turn, turn))
        if entry is None or entry.state == "leaving":
            return
        entry.state = "leaving"
        if entry.revision:
            self._spawn(self._delete(entry))
        # else: its put is under way or not sent; _put sees "leaving" and deletes

    def may_grant(self) -> bool:
        return (
            self.connected
            and not self.fenced
            and not self.closing
            and self.lease != 0
            and deadman.boottime() < self._stop_at()
        )

    def held(self) -> list[str]:
        return [e.turn for e in self.entries.values() if e.state == "held"]

    # --- the lease (its own thread) ---------------------------------------------------------

    def _keep_alive(self) -> None:
        s = self.settings
        interval = s.renew_interval(self.grace)
        # One member's answer may take this long; failover tries the next one.
        timeout = max(0.5, min(s.timeout, s.stop_window(self.grace) / 4))
        lease = 0
        while not self._stop.is_set():
            sent = deadman.boottime()
            try:
                if lease == 0:
                    lease, ttl = self.client.lease_grant(max(1, round(s.lease_ttl)))
                    self._push_deadline(sent + ttl)
                    self._post(self._on_lease, lease, ttl, sent + ttl, True)
                else:
                    ttl = self.client.lease_keepalive(lease, timeout)
                    if ttl <= 0:
                        self._post(self._on_lease_gone, lease)
                        lease = 0
                        continue
                    self._push_deadline(sent + ttl)
                    self._post(self._on_lease, lease, ttl, sent + ttl, False)
            except EtcdError as e:
                self._post(self._on_unreachable, e.message)
                self._pause(RETRY)
                continue
            self._pause(interval)

    def _pause(self, seconds: float) -> None:
        self._nudge.wait(seconds)
        self._nudge.clear()

    def _push_deadline(self, deadline: float) -> None:
        """From the keep-alive thread: guards see the new deadline even if the loop is busy."""
        try:
            self.deadline_file.parent.mkdir(parents=True, exist_ok=True)
            deadman.write_deadline(
                self.deadline_file, deadline - self.grace - FENCE_MARGIN, deadline - KILL_MARGIN
            )
        except OSError as e:
            # Guards then stop at the old deadline: the safe side, loudly.
            log.error("unable to write the deadline file %s: %s", self.deadline_file, e.strerror)

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(fn, *args)

    def _stop_at(self) -> float:
        return self.deadline - self.grace - FENCE_MARGIN

    def _on_lease(self, lease: int, ttl: int, deadline: float, new: bool) -> None:
        if self.closing:
            return
        was_connected = self.connected and not self.lost
        self.lease, self.lease_ttl, self.deadline = lease, ttl, deadline
        self.connected, self.lost = True, False
        self._arm_fence()
        if new or not was_connected or self.fenced:
            self.fenced = False
            body = {"name": self.name, "lease": f"{lease:x}", "ttl": ttl, "new_lease": new}
            self.publish("cluster.connected", body)
            log.info("cluster: connected (lease %x, ttl %ds)", lease, ttl)
        if new:
            self._spawn(self._after_new_lease())
        elif not was_connected:
            self._spawn(self._after_reconnect())
        self.wake()

    def _on_unreachable(self, error: str) -> None:
        if self.closing or self.lost:
            return
        self.lost = True
        if self._watch is not None:
            self._watch.close()  # it may hang on a dead connection: opened again once renewed
        left = self.deadline - deadman.boottime() if self.deadline else None
        self.publish("cluster.lost", {"name": self.name, "error": error, "deadline_in": left})
        log.warning("cluster: etcd does not answer: %s", error)

    def _on_lease_gone(self, lease: int) -> None:
        if lease != self.lease or self.closing:
            return
        log.warning("cluster: lease %x is gone (expired or revoked)", lease)
        self.lease, self.deadline = 0, 0.0
        self._fence("lease_gone")
        for entry in self.entries.values():
            if entry.state in ("waiting", "ready"):
                entry.state, entry.revision = "joining", 0  # its key died with the lease

    def _arm_fence(self) -> None:
        if self._fence_timer is not None:
            self._fence_timer.cancel()
        assert self._loop is not None
        delay = max(0.0, self._stop_at() - deadman.boottime())
        self._fence_timer = self._loop.call_later(delay, self._check_fence)

    def _check_fence(self) -> None:
        self._fence_timer = None
        left = self._stop_at() - deadman.boottime()
        if left > 0:  # renewed meanwhile, or the loop's clock ran apart from boottime (suspend)
            self._fence_timer = self._loop.call_later(left, self._check_fence)  # type: ignore[union-attr]
            return
        self._on_unreachable("no renewal was answered before the turns had to stop")
        self._fence("lease_deadline")

    def _fence(self, reason: str) -> None:
        """Stop every held turn; grant nothing until a renewal succeeds."""
        if self.closing:
            return
        first = not self.fenced
        self.fenced = True
        stopping = []
        for entry in self.entries.values():
            if entry.state == "held" and not entry.stopped:
                entry.stopped = True
                stopping.append(entry.turn)
        if first or stopping:
            left = self.deadline - deadman.boottime() if self.deadline else None
            self.publish(
                "cluster.fenced",
                {"name": self.name, "reason": reason, "turns": stopping, "deadline_in": left},
            )
            log.warning("cluster: fenced (%s); stopping %d turn(s)", reason, len(stopping))
        for turn in stopping:
            self.stop_turn(turn, f"cluster_{reason}")

    # --- keys -------------------------------------------------------------------------------

    async def _after_new_lease(self) -> None:
        if not self._caps_written:
            await self._write_caps()
        await self._read_and_watch()
        for entry in list(self.entries.values()):
            if entry.state == "joining":
                await self._put(entry)

    async def _after_reconnect(self) -> None:
        await self._read_and_watch()
        for entry in list(self.entries.values()):
            if entry.state == "joining":
                await self._put(entry)
        for key in {e.key for e in self.entries.values()}:
            self._mark(key)

    async def _write_caps(self) -> None:
        try:
            for name, cap in self.caps.items():
                await self._run(self.client.put, self.cap_prefix + name, str(cap).encode())
            self._caps_written = True
        except EtcdError as e:
            log.warning("cluster: unable to write the caps: %s", e.message)

    async def set_caps(self, caps: dict[str, int]) -> None:
        """At reload: the configured caps, written to etcd (the watch brings the change back)."""
        self.caps = dict(caps)
        self._caps_written = False
        if self.connected:
            await self._write_caps()

    async def _put(self, entry: _Entry) -> None:
        lease = self.lease
        if entry.state != "joining" or entry.putting or not lease or self.lost:
            return  # joins when a lease is granted or renewed (_after_new_lease, _after_reconnect)
        value = json.dumps(
            {"machine": self.name, "turn": entry.turn, "holder": entry.holder, "since": entry.since}
        ).encode()
        # Created only if absent: a retried put whose first answer was lost must not change the
        # key; either way the answer says the key's create revision and lease.
        entry.putting = True
        try:
            result = await self._run(
                self.client.txn,
                [compare_create(entry.qkey, 0)],
                [op_put(entry.qkey, value, lease)],
                [op_get(entry.qkey)],
            )
        except EtcdError as e:
            log.warning("cluster: unable to queue turn %s: %s", entry.turn, e.message)
            self._later(self._put, entry)  # and at the next new lease or reconnection
            return
        finally:
            entry.putting = False
        if result.succeeded:
            revision, key_lease = result.revision, lease
        else:
            kvs = txn_range_kvs(result)
            revision, key_lease = (kvs[0].create_revision, kvs[0].lease) if kvs else (0, 0)
        if lease != self.lease or key_lease != lease:
            # The lease changed meanwhile (that key is dead), or the key is another lease's: a
            # stale key of an earlier incarnation of this machine (a restart); it dies with its
            # lease, and its DELETE event puts ours (_on_our_key_deleted).
            if key_lease != lease:
                log.info("cluster: %s is still held by lease %x, not ours", entry.qkey, key_lease)
            if self.lease and self.lease != lease:
                self._spawn(self._put(entry))
            return
        entry.revision, entry.lease = revision, lease
        if _leaving(entry):  # release() came while the put was under way
            await self._delete(entry)
            return
        entry.state = "waiting"
        self._mark(entry.key)

    async def _delete(self, entry: _Entry) -> None:
        compare = [
            compare_lease(entry.qkey, entry.lease),
            compare_create(entry.qkey, entry.revision),
        ]
        while not self.closing:
            try:
                await self._run(self.client.txn, compare, [op_delete(entry.qkey)])
            except EtcdError as e:
                if not e.unavailable:
                    log.error("cluster: unable to release %s: %s", entry.qkey, e.message)
                    break
                await asyncio.sleep(RETRY)  # the key stays counted until deleted or its lease ends
                continue
            break
        if self.entries.get(entry.turn) is entry:
            del self.entries[entry.turn]
        if self._by_qkey.get(entry.qkey) is entry:
            del self._by_qkey[entry.qkey]

    def _mark(self, key: str) -> None:
        self._dirty.add(key)
        if self._evaluating is None or self._evaluating.done():
            self._evaluating = self._spawn(self._evaluate())

    async def _evaluate(self) -> None:
        while self._dirty and not self.closing and not self.lost:  # lost: _after_reconnect
            key = self._dirty.pop()
            waiting = [
                e for e in self.entries.values() if e.key == key and e.state in ("waiting", "ready")
            ]
            if not waiting:
                continue
            cap = self.cap_of(key)
            try:
                found = await self._run(
                    self.client.range,
                    f"{self.q_prefix}{key}/",
                    prefix=True,
                    sort_target="CREATE",
                    sort_order="ASCEND",
                    limit=cap,
                    keys_only=True,
                )
            except EtcdError as e:
                log.warning("cluster: unable to read the queue of %s: %s", key, e.message)
                self._later(self._mark, key)  # and when the lease is renewed (_after_reconnect)
                return
            first = {kv.key for kv in found.kvs}
            woke = False
            for entry in waiting:
                if entry.state not in ("waiting", "ready"):
                    continue  # changed while we read
                if entry.qkey in first:
                    woke = woke or entry.state == "waiting"
                    entry.state = "ready"
                else:
                    entry.state = "waiting"  # a lowered cap
            if woke:
                self.wake()

    # --- the watch (its own thread) ---------------------------------------------------------

    async def _read_and_watch(self) -> None:
        """Read the caps, then watch everything under the prefix from the next revision."""
        if self._watch_opening or (self._watcher is not None and self._watcher.is_alive()):
            return
        self._watch_opening = True
        try:
            await self._read_caps_and_open_watch()
        finally:
            self._watch_opening = False

    async def _read_caps_and_open_watch(self) -> None:
        while not self.closing:
            try:
                found = await self._run(self.client.range, self.cap_prefix, prefix=True)
                break
            except EtcdError as e:
                log.warning("cluster: unable to read the caps: %s", e.message)
                await asyncio.sleep(RETRY)
        else:
            return
        self._apply_caps(_caps_from(found.kvs, self.cap_prefix), replace=True)
        if not self._watch_from:
            self._watch_from = found.revision + 1
        self._open_watch()
        for key in {e.key for e in self.entries.values()}:
            self._mark(key)

    def _open_watch(self) -> None:
        self._watch_generation += 1
        generation = self._watch_generation
        watch = self.client.watch(
            self.settings.prefix + "/", prefix=True, start_revision=self._watch_from
        )
        self._watch = watch
        self._watcher = threading.Thread(
            target=self._follow, args=(watch, generation), name="ccsup-watch", daemon=True
        )
        self._watcher.start()

    def _follow(self, watch: Any, generation: int) -> None:
        try:
            for batch in watch:
                self._post(self._on_batch, batch, generation)
        except EtcdError as e:
            self._post(self._on_watch_broken, e, generation)

    def _on_watch_broken(self, error: EtcdError, generation: int) -> None:
        if generation != self._watch_generation or self.closing:
            return
        log.info("cluster: the watch broke (%s); opening it again", error.message)
        self._watcher = None
        if not error.unavailable:  # compacted: read everything again
            self._watch_from = 0
        self._spawn(self._rewatch())

    async def _rewatch(self) -> None:
        await asyncio.sleep(RETRY)
        await self._read_and_watch()

    def _on_batch(self, batch: WatchBatch, generation: int) -> None:
        if generation != self._watch_generation or self.closing:
            return
        self._watch_from = max(self._watch_from, batch.revision + 1)
        caps: dict[str, int] = {}
        for event in batch.events:
            name = event.kv.key
            if name.startswith(self.cap_prefix):
                value = _cap_value(event.kv.value) if event.type == "PUT" else None
                if value is not None:
                    caps[name[len(self.cap_prefix) :]] = value
                continue
            if not name.startswith(self.q_prefix):
                continue
            key, _, rest = name[len(self.q_prefix) :].partition("/")
            machine, _, turn = rest.partition("/")
            if event.type == "DELETE":
                self._mark(key)
                if machine == self.name:
                    self._on_our_key_deleted(name)
        if caps:
            self._apply_caps(caps, replace=False)

    def _on_our_key_deleted(self, qkey: str) -> None:
        entry = self._by_qkey.get(qkey)
        if entry is None or entry.qkey != qkey or entry.state == "leaving":
            return
        turn = entry.turn
        if entry.state == "joining":
            # The key of an earlier incarnation of this supervisor (same turn, another lease)
            # stood in the way of ours: it is gone now.
            self._spawn(self._put(entry))
            return
        if entry.state == "held":
            if not entry.stopped:
                entry.stopped = True
                log.warning("cluster: the key of turn %s vanished; stopping it", turn)
                self.stop_turn(turn, "cluster_key_lost")
            self._nudge.set()  # most likely the lease is gone: ask etcd now
            return
        entry.state, entry.revision = "joining", 0  # waiting: join again (at the back)
        self._spawn(self._put(entry))

    def _apply_caps(self, caps: dict[str, int], *, replace: bool) -> None:
        before = dict(self.stored_caps)
        after = dict(caps) if replace else {**before, **caps}
        self.stored_caps = after
        for name in sorted(set(before) | set(after)):
            if before.get(name) != after.get(name):
                log.info(
                    "cluster: cap of %s is %s (was %s)", name, after.get(name), before.get(name)
                )
                self.publish(
                    "cluster.cap", {"key": name, "cap": after.get(name), "was": before.get(name)}
                )
        for key in {e.key for e in self.entries.values()}:
            self._mark(key)

    # --- views ------------------------------------------------------------------------------

    async def view(self) -> list[ClusterKeyView]:
        """Every cluster key with turns: holders on every machine, waiters in cluster order."""
        found = await self._run(
            self.client.range, self.q_prefix, prefix=True, sort_target="CREATE", sort_order="ASCEND"
        )
        by_key: dict[str, list[ClusterEntry]] = {}
        for kv in found.kvs:
            key, _, rest = kv.key[len(self.q_prefix) :].partition("/")
            machine, _, turn = rest.partition("/")
            try:
                value = json.loads(kv.value)
            except ValueError:
                value = {}
            mine = self._by_qkey.get(kv.key) if machine == self.name else None
            if mine is not None:  # the turn that has this place now (see _swap)
                turn, value["holder"] = mine.turn, mine.holder
            by_key.setdefault(key, []).append(
                {
                    "machine": machine,
                    "turn": turn,
                    "holder": value.get("holder") or {},
                    "since": value.get("since") or 0.0,
                    "revision": kv.create_revision,
                }
            )
        views: list[ClusterKeyView] = []
        keys = set(by_key) | {e.key for e in self.entries.values()}
        for key in sorted(keys):
            queue = by_key.get(key, [])
            cap = self.cap_of(key)
            local = []
            for position, item in enumerate(queue[cap:], start=1):
                if item["machine"] == self.name:
                    local.append({"turn": item["turn"], "position": position})
            views.append(
                {
                    "key": key,
                    "cap": cap,
                    "holders": queue[:cap],
                    "waiting": queue[cap:],
                    "local_waiters": local,
                }
            )
        return views

    async def status(self) -> ClusterStatus:
        members = await self._run(self.client.members_status, 1.0)
        left = self.deadline - deadman.boottime() if self.deadline else None
        return {
            "name": self.name,
            "prefix": self.settings.prefix,
            "etcd": list(self.settings.etcd),
            "connected": self.connected and not self.lost,
            "fenced": self.fenced,
            "lease": f"{self.lease:x}" if self.lease else None,
            "lease_ttl": self.lease_ttl,
            "deadline_in": left,
            "members": [
                {"endpoint": m.endpoint, "ok": m.ok, "leader": m.leader, "error": m.error}
                for m in members
            ],
            "caps": {k: self.cap_of(k) for k in sorted(set(self.caps) | set(self.stored_caps))},
        }

    # --- plumbing ---------------------------------------------------------------------------

    async def _run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(*args, **kwargs))

    def _later(self, fn: Callable[..., Any], *args: Any) -> None:
        """Try again after RETRY (a coroutine function is run as a task)."""
        if self.closing or self._loop is None:
            return

        def again() -> None:
            if self.closing:
                return
            result = fn(*args)
            if asyncio.iscoroutine(result):
                self._spawn(result)

        self._loop.call_later(RETRY, again)

    def _spawn(self, coro: Any) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("cluster: a task failed", exc_info=task.exception())


def _leaving(entry: _Entry) -> bool:
    return entry.state == "leaving"


def check_timing(settings: ClusterSettings, grace: float) -> None:
    from .cluster_settings import timing_problem

    problem = timing_problem(settings.lease_ttl, grace)
    if problem:
        raise ConfigError(f"[cluster] lease_ttl: {problem}")
