"""The cluster caps: how many turns of a cluster key may run at once across every machine.

What it knows: the caps this machine is configured with (written to etcd at start and reload as
`<prefix>/cap/<key>`), the caps as etcd has them (what grants go by: the last writer wins, so
every machine agrees), how a cap's value is read, and which applies to a key (its own, else its
harness entry's, else the configured one, else 1). What it does not know: the watch that brings
etcd's caps (supervisor.cluster.watch calls `caps_from`/`cap_value` and the gate hands the result
to `apply`), queues, leases or turns.

State: nothing on this machine; etcd holds the caps. A write that fails is tried again at the
next new lease (`written` stays False); a restarted supervisor writes its configured caps again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..config.cluster import ClusterSettings
from .etcd import EtcdClient, KeyValue
from .loop import LoopBridge
from .transport import EtcdError

log = logging.getLogger("ccsup.cluster")


def caps_from(kvs: list[KeyValue], cap_prefix: str) -> dict[str, int]:
    """The caps among kvs (keys under cap_prefix); a value that is not a whole number >= 1 is
    no cap."""
    caps = {}
    for kv in kvs:
        value = cap_value(kv.value)
        if value is not None:
            caps[kv.key[len(cap_prefix) :]] = value
    return caps


def cap_value(raw: bytes) -> int | None:
    try:
        value = int(raw.decode())
    except (UnicodeDecodeError, ValueError):
        return None
    return value if value >= 1 else None


class ClusterCaps:
    """See the module docstring. Runs on the event loop."""

    def __init__(
        self,
        settings: ClusterSettings,
        client: EtcdClient,
        bridge: LoopBridge,
        publish: Callable[[str, dict], None],
    ):
        self.settings = settings
        self.client = client
        self.bridge = bridge
        self.publish = publish
        self.prefix = f"{settings.prefix}/cap/"
        self.configured = dict(settings.caps)  # written to etcd at start and reload
        self.stored: dict[str, int] = {}  # as etcd has them (what grants go by)
        self.written = False

    def cap_of(self, key: str) -> int:
        """The cluster cap grants go by: etcd's value for the key or its harness, else ours."""
        entry = self.settings.cap_entry(key)
        for name in (key, entry):
            if name is not None and name in self.stored:
                return self.stored[name]
        return self.configured.get(entry or key, 1)

    def known(self) -> dict[str, int]:
        """Every key with a cap, configured or stored, and the cap it goes by."""
        return {k: self.cap_of(k) for k in sorted(set(self.configured) | set(self.stored))}

    async def write(self) -> None:
        try:
            for name, cap in self.configured.items():
                await self.bridge.run(self.client.put, self.prefix + name, str(cap).encode())
            self.written = True
        except EtcdError as e:
            log.warning("cluster: unable to write the caps: %s", e.message)

    def configure(self, caps: dict[str, int]) -> None:
        """At reload: the configured caps, to be written (`write`)."""
        self.configured = dict(caps)
        self.written = False

    def apply(self, caps: dict[str, int], *, replace: bool) -> None:
        """etcd's caps as read (replace) or as changed (merged); each change is published."""
        before = dict(self.stored)
        after = dict(caps) if replace else {**before, **caps}
        self.stored = after
        for name in sorted(set(before) | set(after)):
            if before.get(name) != after.get(name):
                log.info(
                    "cluster: cap of %s is %s (was %s)", name, after.get(name), before.get(name)
                )
                self.publish(
                    "cluster.cap", {"key": name, "cap": after.get(name), "was": before.get(name)}
                )
