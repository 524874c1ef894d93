"""The cluster gate: caps that hold across every supervisor of a cluster, kept in etcd v3.

What it knows: this machine's turns of cluster keys (`entries`: one etcd key per waiting or held
turn, `<prefix>/q/<key>/<machine>/<turn>`), the cluster cap of each key, which turns may be
granted, and what to do when the lease is renewed, lost or past its deadline (fence: stop every
held turn). What it does not know: local slots, guards, turn states, the manager (the manager asks
it `try_take` before a grant and tells it `release` after a confirmed gone; it tells its
`listeners` `stop_turn` and `wake`, the daemon's being supervisor.cluster.wiring's
`ManagerListener`); the lease's keep-alive and deadline (supervisor.cluster.lease); the watch and
the key layout's parsing (supervisor.cluster.watch); the views (supervisor.cluster.view); threads
and the pool (supervisor.cluster.loop).

Design note.
- A turn of a cluster key joins the cluster queue when it is queued here: its key is put under
  this supervisor's lease. It may be granted when its key is among the first `cap` keys under
  `<prefix>/q/<key>/` sorted by create revision (one range with sort and limit: etcd's count
  ignores revision filters). The create revision is a global ticket: FIFO across machines. A
  machine's places serve its own waiters in its own order (a waiter may take its machine's first
  place in exchange for its own key: `_swap`), so a local order that differs from the keys' (a
  fairness policy, puts finishing out of order) never leaves a place unused and never takes a
  second one. A key is deleted only when the manager says its turn's work is confirmed gone (or
  it stopped waiting), in a txn that checks the key still has our lease and our create revision.
- The watch tells of every release, cap change and key of ours that vanished; each marks the key
  to be evaluated again (`_mark`, `_evaluate`: one sorted range per key). A held turn whose key
  vanished is stopped; a waiting one joins again at the back.
- Fencing: when the lease keeper says the deadline is reached or the lease is gone, every held
  turn is stopped and nothing is granted until a renewal succeeds. A lease that etcd no longer
  knows: a new lease is granted and the turns still waiting join again (they lose their place:
  their old keys died with the old lease).

State: nothing on this machine (the lease keeper writes the deadline file). A supervisor that
stops half-way (SIGKILL) leaves its keys under its lease: they vanish with the lease, a TTL
later, and its guards end their work when their parent or their deadline goes, before D. A
restarted supervisor has a new lease and joins its waiting turns again (new revisions). Keys of a
machine with the same name and another lease are another incarnation's: never touched here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from ..config.cluster import ClusterSettings
from .caps import ClusterCaps
from .etcd import (
    EtcdClient,
    compare_create,
    compare_lease,
    op_delete,
    op_get,
    op_put,
    txn_range_kvs,
)
from .lease import LeaseKeeper
from .loop import RETRY, LoopBridge
from .quota import ClusterQuota
from .transport import EtcdError
from .view import ClusterKeyView, ClusterStatus, key_views, status_of
from .watch import ClusterWatch

log = logging.getLogger("ccsup.cluster")

EntryState = Literal["joining", "waiting", "ready", "held", "leaving"]


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


class Listener(Protocol):
    """What the gate tells the turns it gates (on the event loop)."""

    def wake(self) -> None:
        """A place came free, or the lease is back: grant again."""

    def stop_turn(self, turn: str, reason: str) -> None:
        """A held turn must stop (fenced, or its key vanished): `reason` starts with cluster_."""


class ClusterGate:
    """See the module docstring. Every public method runs on the event loop."""

    def __init__(
        self,
        settings: ClusterSettings,
        *,
        deadline_file: Path,
        grace: float,
        publish: Callable[[str, dict], None],
        client: EtcdClient | None = None,
    ):
        self.settings = settings
        self.name = settings.name
        self.publish = publish
        # Told of wakes and stops, as the ledger's observers are of events: none until one
        # subscribes (the gate grants nothing before start(), so nothing is missed).
        self.listeners: list[Listener] = []
        self.client = client or EtcdClient(settings.etcd_settings())
        self.bridge = LoopBridge()
        self.keeper = LeaseKeeper(
            settings,
            self.client,
            self.bridge,
            deadline_file=deadline_file,
            grace=grace,
            publish=publish,
            owner=self,
        )
        self.watch = ClusterWatch(settings, self.client, self.bridge, owner=self)
        self.quota = ClusterQuota(settings.prefix, self.client, self.bridge)
        self.q_prefix = f"{settings.prefix}/q/"
        self.caps = ClusterCaps(settings, self.client, self.bridge, publish)
        self.entries: dict[str, _Entry] = {}  # by turn id
        self._dirty: set[str] = set()
        self._evaluating: asyncio.Task | None = None
        self._aliases: dict[str, str] = {}  # a bound reservation's id -> its turn's (rebind)
        self._by_qkey: dict[str, _Entry] = {}  # our etcd keys -> their entries (see _swap)

    # State kept by the bridge and the lease keeper, read here (and by tests) under old names.
    @property
    def closing(self) -> bool:
        return self.bridge.closing

    @property
    def lease(self) -> int:
        return self.keeper.lease

    @property
    def deadline(self) -> float:
        """D, boottime seconds; 0 while no lease."""
        return self.keeper.deadline

    # --- life -------------------------------------------------------------------------------

    def start(self) -> None:
        """Begin: the keep-alive thread grants a lease; the rest follows from its answers."""
        self.bridge.attach()
        self.keeper.start()

    async def close(self, revoke: bool = True) -> None:
        """Stop the threads; revoke the lease (its keys go at once) unless told not to."""
        self.bridge.closing = True
        self.keeper.stop()
        self.watch.interrupt()
        self.bridge.cancel_tasks()
        await self.keeper.join()
        if revoke and self.lease:
            lease = self.lease
            with contextlib.suppress(EtcdError):
                await self.bridge.run(self.client.lease_revoke, lease, 1.0)
        self.bridge.shutdown()

    # --- what the manager calls -------------------------------------------------------------

    def is_cluster_key(self, key: str) -> bool:
        return self.settings.is_cluster_key(key)

    def cap_of(self, key: str) -> int:
        return self.caps.cap_of(key)

    def join(self, key: str, turn: str, holder: dict[str, Any] | None = None) -> None:
        """A turn of a cluster key is queued: its key joins the cluster queue."""
        if turn in self.entries:
            return
        entry = _Entry(key, turn, f"{self.q_prefix}{key}/{self.name}/{turn}", holder or {})
        self.entries[turn] = entry
        self._by_qkey[entry.qkey] = entry
        self.bridge.spawn(self._put(entry))

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
            self.bridge.spawn(self._put(ready))

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
                self.bridge.spawn(self._delete(dup))
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
            self.bridge.spawn(self._delete(entry))
        # else: its put is under way or not sent; _put sees "leaving" and deletes

    def may_grant(self) -> bool:
        return not self.closing and self.keeper.usable()

    def held(self) -> list[str]:
        return [e.turn for e in self.entries.values() if e.state == "held"]

    def _fence(self, reason: str) -> None:
        """Stop every held turn; grant nothing until a renewal succeeds."""
        if self.closing:
            return
        first = not self.keeper.fenced
        self.keeper.fenced = True
        stopping = []
        for entry in self.entries.values():
            if entry.state == "held" and not entry.stopped:
                entry.stopped = True
                stopping.append(entry.turn)
        if first or stopping:
            left = self.keeper.deadline_in()
            self.publish(
                "cluster.fenced",
                {"name": self.name, "reason": reason, "turns": stopping, "deadline_in": left},
            )
            log.warning("cluster: fenced (%s); stopping %d turn(s)", reason, len(stopping))
        for turn in stopping:
            self._stop_turn(turn, f"cluster_{reason}")

    def _wake(self) -> None:
        for listener in self.listeners:
            listener.wake()

    def _stop_turn(self, turn: str, reason: str) -> None:
        for listener in self.listeners:
            listener.stop_turn(turn, reason)

    # --- keys -------------------------------------------------------------------------------

    async def _after_new_lease(self) -> None:
        if not self.caps.written:
            await self.caps.write()
        await self.watch.open()
        for entry in list(self.entries.values()):
            if entry.state == "joining":
                await self._put(entry)

    async def _after_reconnect(self) -> None:
        await self.watch.open()
        for entry in list(self.entries.values()):
            if entry.state == "joining":
                await self._put(entry)
        for key in {e.key for e in self.entries.values()}:
            self._mark(key)

    async def set_caps(self, caps: dict[str, int]) -> None:
        """At reload: the configured caps, written to etcd (the watch brings the change back)."""
        self.caps.configure(caps)
        if self.keeper.connected:
            await self.caps.write()

    async def _put(self, entry: _Entry) -> None:
        lease = self.lease
        if entry.state != "joining" or entry.putting or not lease or self.keeper.lost:
            return  # joins when a lease is granted or renewed (_after_new_lease, _after_reconnect)
        value = json.dumps(
            {"machine": self.name, "turn": entry.turn, "holder": entry.holder, "since": entry.since}
        ).encode()
        # Created only if absent: a retried put whose first answer was lost must not change the
        # key; either way the answer says the key's create revision and lease.
        entry.putting = True
        try:
            result = await self.bridge.run(
                self.client.txn,
                [compare_create(entry.qkey, 0)],
                [op_put(entry.qkey, value, lease)],
                [op_get(entry.qkey)],
            )
        except EtcdError as e:
            log.warning("cluster: unable to queue turn %s: %s", entry.turn, e.message)
            self.bridge.later(self._put, entry)  # and at the next new lease or reconnection
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
                self.bridge.spawn(self._put(entry))
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
                await self.bridge.run(self.client.txn, compare, [op_delete(entry.qkey)])
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
            self._evaluating = self.bridge.spawn(self._evaluate())

    async def _evaluate(self) -> None:
        while self._dirty and not self.closing and not self.keeper.lost:  # lost: _after_reconnect
            key = self._dirty.pop()
            waiting = [
                e for e in self.entries.values() if e.key == key and e.state in ("waiting", "ready")
            ]
            if not waiting:
                continue
            cap = self.cap_of(key)
            try:
                found = await self.bridge.run(
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
                self.bridge.later(
                    self._mark, key
                )  # and when the lease is renewed (_after_reconnect)
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
                self._wake()

    def _on_our_key_deleted(self, qkey: str) -> None:
        entry = self._by_qkey.get(qkey)
        if entry is None or entry.qkey != qkey or entry.state == "leaving":
            return
        turn = entry.turn
        if entry.state == "joining":
            # The key of an earlier incarnation of this supervisor (same turn, another lease)
            # stood in the way of ours: it is gone now.
            self.bridge.spawn(self._put(entry))
            return
        if entry.state == "held":
            if not entry.stopped:
                entry.stopped = True
                log.warning("cluster: the key of turn %s vanished; stopping it", turn)
                self._stop_turn(turn, "cluster_key_lost")
            self.keeper.nudge()  # most likely the lease is gone: ask etcd now
            return
        entry.state, entry.revision = "joining", 0  # waiting: join again (at the back)
        self.bridge.spawn(self._put(entry))

    # --- what the lease keeper tells (supervisor.cluster.lease) -----------------------------

    def lease_renewed(self, new: bool, was_connected: bool) -> None:
        if new:
            self.bridge.spawn(self._after_new_lease())
        elif not was_connected:
            self.bridge.spawn(self._after_reconnect())
        self._wake()

    def lease_unreachable(self) -> None:
        self.watch.interrupt()  # it may hang on a dead connection: opened again once renewed

    def lease_gone(self) -> None:
        self._fence("lease_gone")
        for entry in self.entries.values():
            if entry.state in ("waiting", "ready"):
                entry.state, entry.revision = "joining", 0  # its key died with the lease

    def lease_deadline_reached(self) -> None:
        self._fence("lease_deadline")

    # --- what the watch tells (supervisor.cluster.watch) ------------------------------------

    def caps_seen(self, caps: dict[str, int], *, replace: bool) -> None:
        self.caps.apply(caps, replace=replace)
        for key in {e.key for e in self.entries.values()}:
            self._mark(key)

    def watch_opened(self) -> None:
        for key in {e.key for e in self.entries.values()}:
            self._mark(key)

    def quota_event(self, name: str, value: bytes, *, deleted: bool) -> None:
        self.quota.event(name, value, deleted=deleted)

    async def quota_read_all(self) -> None:
        await self.quota.read_all()

    def queue_key_deleted(self, key: str, machine: str, qkey: str) -> None:
        self._mark(key)
        if machine == self.name:
            self._on_our_key_deleted(qkey)

    # --- views ------------------------------------------------------------------------------

    async def view(self) -> list[ClusterKeyView]:
        """Every cluster key with turns: holders on every machine, waiters in cluster order."""
        found = await self.bridge.run(
            self.client.range, self.q_prefix, prefix=True, sort_target="CREATE", sort_order="ASCEND"
        )

        def mine(qkey: str) -> tuple[str, dict[str, Any]] | None:
            entry = self._by_qkey.get(qkey)
            return (entry.turn, entry.holder) if entry is not None else None

        return key_views(
            found.kvs,
            q_prefix=self.q_prefix,
            name=self.name,
            mine=mine,
            local_keys={e.key for e in self.entries.values()},
            cap_of=self.cap_of,
        )

    async def status(self) -> ClusterStatus:
        members = await self.bridge.run(self.client.members_status, 1.0)
        return status_of(self.settings, self.keeper, members, self.caps.known())


def _leaving(entry: _Entry) -> bool:
    """entry.state, read again after an await (mypy would keep it narrowed to the old value)."""
    return entry.state == "leaving"
