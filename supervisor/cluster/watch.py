"""The cluster watch: one etcd watch on `<prefix>/`, read in a thread of its own, and the caps.

What it knows: the layout of the keys under the prefix (`<prefix>/cap/<key>` holds a cap,
`<prefix>/q/<key>/<machine>/<turn>` a place in a cluster queue, `<prefix>/quota/<key>/<window>`
a key's provider window: supervisor.cluster.quota), the revision the next watch
starts from, and the watch thread (a cap's value is read by supervisor.cluster.caps). What it does not know: leases, turns,
entries or grants: it tells its owner (the gate, `WatchOwner`) the caps it read or saw change and
every queue key that was deleted, and the owner decides.

Design note. One watch on `<prefix>/`, from the revision of the last read, tells of every
release, every cap change and every key of ours that vanished (a revoked or expired lease); there
is no polling. A broken watch is opened again from the last revision it delivered, so nothing is
missed; a watch etcd cancelled (compacted) starts over with a fresh read of the caps. The thread
only posts batches to the loop (supervisor.cluster.loop); every decision is made there.

State: none stored on this machine; the caps are etcd's, read again at every (re)open.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Protocol

from ..config.cluster import ClusterSettings
from .caps import cap_value, caps_from
from .etcd import EtcdClient, Watch, WatchBatch
from .loop import RETRY, LoopBridge
from .transport import EtcdError

log = logging.getLogger("ccsup.cluster")


class WatchOwner(Protocol):
    """What the watch tells, on the loop."""

    def caps_seen(self, caps: dict[str, int], *, replace: bool) -> None: ...
    def watch_opened(self) -> None: ...
    def queue_key_deleted(self, key: str, machine: str, qkey: str) -> None: ...
    def quota_event(self, name: str, value: bytes, *, deleted: bool) -> None: ...
    async def quota_read_all(self) -> None: ...


class ClusterWatch:
    """See the module docstring. Every public method runs on the event loop."""

    def __init__(
        self,
        settings: ClusterSettings,
        client: EtcdClient,
        bridge: LoopBridge,
        owner: WatchOwner,
    ):
        self.settings = settings
        self.client = client
        self.bridge = bridge
        self.owner = owner
        self.q_prefix = f"{settings.prefix}/q/"
        self.cap_prefix = f"{settings.prefix}/cap/"
        self.quota_prefix = f"{settings.prefix}/quota/"
        self._watch: Watch | None = None
        self._thread: threading.Thread | None = None
        self._from = 0  # the revision a new watch starts at
        self._generation = 0
        self._opening = False

    async def open(self) -> None:
        """Read the caps, then watch everything under the prefix from the next revision (nothing
        when a watch is open or being opened)."""
        if self._opening or (self._thread is not None and self._thread.is_alive()):
            return
        self._opening = True
        try:
            await self._read_caps_and_open()
        finally:
            self._opening = False

    def interrupt(self) -> None:
        """End the open watch (it may hang on a dead connection); `open` starts another."""
        if self._watch is not None:
            self._watch.close()

    async def _read_caps_and_open(self) -> None:
        while not self.bridge.closing:
            try:
                found = await self.bridge.run(self.client.range, self.cap_prefix, prefix=True)
                break
            except EtcdError as e:
                log.warning("cluster: unable to read the caps: %s", e.message)
                await asyncio.sleep(RETRY)
        else:
            return
        self.owner.caps_seen(caps_from(found.kvs, self.cap_prefix), replace=True)
        try:
            await self.owner.quota_read_all()
        except EtcdError as e:
            log.warning("cluster: unable to read the keys' windows: %s", e.message)
        if not self._from:
            self._from = found.revision + 1
        self._start()
        self.owner.watch_opened()

    def _start(self) -> None:
        self._generation += 1
        generation = self._generation
        watch = self.client.watch(
            self.settings.prefix + "/", prefix=True, start_revision=self._from
        )
        self._watch = watch
        self._thread = threading.Thread(
            target=self._follow, args=(watch, generation), name="ccsup-watch", daemon=True
        )
        self._thread.start()

    def _follow(self, watch: Watch, generation: int) -> None:
        """The watch thread: every batch, then how it broke, posted to the loop."""
        try:
            for batch in watch:
                self.bridge.post(self._on_batch, batch, generation)
        except EtcdError as e:
            self.bridge.post(self._on_broken, e, generation)

    def _on_broken(self, error: EtcdError, generation: int) -> None:
        if generation != self._generation or self.bridge.closing:
            return
        log.info("cluster: the watch broke (%s); opening it again", error.message)
        self._thread = None
        if not error.unavailable:  # compacted: read everything again
            self._from = 0
        self.bridge.spawn(self._reopen())

    async def _reopen(self) -> None:
        await asyncio.sleep(RETRY)
        await self.open()

    def _on_batch(self, batch: WatchBatch, generation: int) -> None:
        if generation != self._generation or self.bridge.closing:
            return
        self._from = max(self._from, batch.revision + 1)
        caps: dict[str, int] = {}
        for event in batch.events:
            name = event.kv.key
            if name.startswith(self.cap_prefix):
                value = cap_value(event.kv.value) if event.type == "PUT" else None
                if value is not None:
                    caps[name[len(self.cap_prefix) :]] = value
                continue
            if name.startswith(self.quota_prefix):
                self.owner.quota_event(name, event.kv.value, deleted=event.type == "DELETE")
                continue
            if not name.startswith(self.q_prefix):
                continue
            key, _, rest = name[len(self.q_prefix) :].partition("/")
            machine, _, _turn = rest.partition("/")
            if event.type == "DELETE":
                self.owner.queue_key_deleted(key, machine, name)
        if caps:
            self.owner.caps_seen(caps, replace=False)
