"""A cluster key's provider windows, shared through etcd: one machine's reading holds the key on
every machine.

Layout: `<prefix>/quota/<key>/<window>` holds one window's JSON (`{window, used, resets_at,
source, seen_at}`, supervisor.admission.quota), put by the machine that read it, with no lease
(a window outlives the machine that saw it; it ends at its own reset). The cluster watch
(supervisor.cluster.watch) brings every put and delete under `<prefix>/quota/` to every machine,
and reads them all when it opens; each machine takes a window that is newer than its own
(`KeyControl.quota_merge`: by `seen_at`) and forgets one whose key was deleted (a `quota clear`).

What it knows: the layout and the puts. What it does not know: the book, holds or the watch's
thread. A put that fails (etcd unreachable) is logged and not retried: the next reading puts
again, and a held key is held on this machine anyway.

State: etcd's. A window whose reset passed is skipped by every reader; it is deleted by the
next clear of its key.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from .etcd import EtcdClient
from .loop import LoopBridge
from .transport import EtcdError

log = logging.getLogger("ccsup.cluster")

# (key, window name, the window's JSON or None when deleted), on the loop.
QuotaSeen = Callable[[str, str, dict[str, Any] | None], None]


class ClusterQuota:
    def __init__(self, prefix: str, client: EtcdClient, bridge: LoopBridge):
        self.prefix = f"{prefix}/quota/"
        self.client = client
        self.bridge = bridge
        self.seen: QuotaSeen = lambda key, window, value: None  # set by the wiring
        self._shared: dict[str, set[str]] = {}  # key -> the window names put from here

    def share(self, key: str, windows: list[dict[str, Any]]) -> None:
        """This machine's windows of `key` now (after a reading or a clear): put them, and
        delete the ones put from here before that are gone (cleared)."""
        names = {w["window"] for w in windows}
        gone = self._shared.get(key, set()) - names
        self._shared[key] = names
        self.bridge.spawn(self._write(key, windows, sorted(gone)))

    async def _write(self, key: str, windows: list[dict[str, Any]], gone: list[str]) -> None:
        try:
            for window in windows:
                name = f"{self.prefix}{key}/{window['window']}"
                await self.bridge.run(self.client.put, name, json.dumps(window).encode())
            for window_name in gone:
                await self.bridge.run(self.client.delete, f"{self.prefix}{key}/{window_name}")
        except EtcdError as e:
            log.warning("cluster: unable to share the windows of %s: %s", key, e.message)

    async def read_all(self) -> None:
        """Every window in etcd (when the watch opens)."""
        found = await self.bridge.run(self.client.range, self.prefix, prefix=True)
        for kv in found.kvs:
            self.event(kv.key, kv.value, deleted=False)

    def event(self, name: str, value: bytes, *, deleted: bool) -> None:
        """A put or delete under `<prefix>/quota/` (from the watch)."""
        key, _, window = name[len(self.prefix) :].partition("/")
        if not key or not window:
            return
        if deleted:
            self.seen(key, window, None)
            return
        try:
            data = json.loads(value)
        except ValueError:
            log.warning("cluster: %s is not JSON: skipped", name)
            return
        if isinstance(data, dict):
            self.seen(key, window, data)
