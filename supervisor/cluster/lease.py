"""The cluster lease: one etcd lease per supervisor, kept alive by a thread, and the fencing
deadline it sets for this supervisor and its guards.

What it knows: the lease (id, TTL), whether etcd answers, the lease deadline D and the moment
turns must be gone by, the dead-man deadline file its guards read, the fence timer, and whether
the supervisor is fenced. What it does not know: keys, the cluster queue, the watch or turns: it
tells its owner (the gate, `LeaseOwner`) that the lease was renewed, is unreachable, is gone or
has reached its deadline, and the owner stops turns and joins them again.

Design note (fencing).
- The lease deadline D = the send time of the last keep-alive that etcd answered + the TTL it
  answered with, on CLOCK_BOOTTIME (which counts suspend). etcd's own expiry is measured from when
  the leader received that keep-alive, so it is never earlier than D (up to the rates of the two
  clocks). Turns must be gone before D: at D - grace - FENCE_MARGIN the owner is told to stop
  every held turn and grants nothing until a renewal succeeds; the guards read the same moment
  from the dead-man deadline file, pushed forward at every renewal by the keep-alive thread, and
  stop their turns on their own when it stops moving (a frozen or dead supervisor). Past
  D - KILL_MARGIN a guard kills without a grace.
- A lease that etcd no longer knows (its keep-alive answers without a TTL) fences at once; a new
  lease is granted and the owner's waiting turns join again.
- The keep-alive runs in a thread of its own (blocking HTTP never runs on the event loop); it only
  posts what etcd answered to the loop (supervisor.cluster.loop), where every decision is made.
  The deadline file is written from the thread, so guards see a renewal even if the loop is busy.

State: the deadline file, rewritten at every renewal (guardd.deadman writes it whole). A
supervisor that stops half-way (SIGKILL) leaves its lease to expire a TTL later and its guards
stop their turns by the deadline in the file, before D. A restarted supervisor grants a new lease
and writes the file again. Nothing else is stored.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from guardd import deadman

from ..config.cluster import FENCE_MARGIN, ClusterSettings
from .etcd import EtcdClient
from .loop import RETRY, LoopBridge
from .transport import EtcdError

log = logging.getLogger("ccsup.cluster")

KILL_MARGIN = 0.25  # past D - KILL_MARGIN a guard kills at once: SIGKILL takes effect in ms


class LeaseOwner(Protocol):
    """What the keeper tells, on the loop."""

    def lease_renewed(self, new: bool, was_connected: bool) -> None: ...
    def lease_unreachable(self) -> None: ...
    def lease_gone(self) -> None: ...
    def lease_deadline_reached(self) -> None: ...


class LeaseKeeper:
    """See the module docstring. Every public method runs on the event loop."""

    def __init__(
        self,
        settings: ClusterSettings,
        client: EtcdClient,
        bridge: LoopBridge,
        *,
        deadline_file: Path,
        grace: float,
        publish: Callable[[str, dict], None],
        owner: LeaseOwner,
    ):
        self.settings = settings
        self.client = client
        self.bridge = bridge
        self.deadline_file = deadline_file
        self.grace = grace
        self.publish = publish
        self.owner = owner
        self.lease = 0
        self.lease_ttl = 0
        self.deadline = 0.0  # D, boottime seconds; 0 while no lease
        self.connected = False
        self.fenced = False  # set by the owner when it fences; cleared by a renewal
        self.lost = False
        self._stop = threading.Event()
        self._nudge = threading.Event()  # renew now (or stop): wakes the keep-alive thread
        self._thread: threading.Thread | None = None
        self._fence_timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """The keep-alive thread grants a lease; the rest follows from its answers."""
        self._thread = threading.Thread(target=self._keep_alive, name="ccsup-lease", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop renewing (the lease is left to the caller: revoke it or let it expire)."""
        self._stop.set()
        self._nudge.set()
        if self._fence_timer is not None:
            self._fence_timer.cancel()

    async def join(self) -> None:
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 5)

    def nudge(self) -> None:
        """Ask etcd now (a key of ours vanished: most likely the lease is gone)."""
        self._nudge.set()

    def stop_at(self) -> float:
        """The moment every held turn must be stopped: D - grace - FENCE_MARGIN (boottime)."""
        return self.deadline - self.grace - FENCE_MARGIN

    def deadline_in(self) -> float | None:
        """Seconds left to D on this machine's clock; None while no lease."""
        return self.deadline - deadman.boottime() if self.deadline else None

    def usable(self) -> bool:
        """A live lease, not fenced, before the stop moment: grants may go by it."""
        return (
            self.connected
            and not self.fenced
            and self.lease != 0
            and deadman.boottime() < self.stop_at()
        )

    # --- the keep-alive thread --------------------------------------------------------------

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
                    self.bridge.post(self._on_lease, lease, ttl, sent + ttl, True)
                else:
                    ttl = self.client.lease_keepalive(lease, timeout)
                    if ttl <= 0:
                        self.bridge.post(self._on_lease_gone, lease)
                        lease = 0
                        continue
                    self._push_deadline(sent + ttl)
                    self.bridge.post(self._on_lease, lease, ttl, sent + ttl, False)
            except EtcdError as e:
                self.bridge.post(self._on_unreachable, e.message)
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

    # --- its answers, on the loop -----------------------------------------------------------

    def _on_lease(self, lease: int, ttl: int, deadline: float, new: bool) -> None:
        if self.bridge.closing:
            return
        was_connected = self.connected and not self.lost
        self.lease, self.lease_ttl, self.deadline = lease, ttl, deadline
        self.connected, self.lost = True, False
        self._arm_fence()
        if new or not was_connected or self.fenced:
            self.fenced = False
            name = self.settings.name
            body = {"name": name, "lease": f"{lease:x}", "ttl": ttl, "new_lease": new}
            self.publish("cluster.connected", body)
            log.info("cluster: connected (lease %x, ttl %ds)", lease, ttl)
        self.owner.lease_renewed(new, was_connected)

    def _on_unreachable(self, error: str) -> None:
        if self.bridge.closing or self.lost:
            return
        self.lost = True
        self.owner.lease_unreachable()
        body = {"name": self.settings.name, "error": error, "deadline_in": self.deadline_in()}
        self.publish("cluster.lost", body)
        log.warning("cluster: etcd does not answer: %s", error)

    def _on_lease_gone(self, lease: int) -> None:
        if lease != self.lease or self.bridge.closing:
            return
        log.warning("cluster: lease %x is gone (expired or revoked)", lease)
        self.lease, self.deadline = 0, 0.0
        self.owner.lease_gone()

    def _arm_fence(self) -> None:
        if self._fence_timer is not None:
            self._fence_timer.cancel()
        assert self.bridge.loop is not None
        delay = max(0.0, self.stop_at() - deadman.boottime())
        self._fence_timer = self.bridge.loop.call_later(delay, self._check_fence)

    def _check_fence(self) -> None:
        self._fence_timer = None
        left = self.stop_at() - deadman.boottime()
        if left > 0:  # renewed meanwhile, or the loop's clock ran apart from boottime (suspend)
            self._fence_timer = self.bridge.loop.call_later(left, self._check_fence)  # type: ignore[union-attr]
            return
        self._on_unreachable("no renewal was answered before the turns had to stop")
        self.owner.lease_deadline_reached()
