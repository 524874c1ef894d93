"""How the cluster gate (supervisor.cluster.gate) hooks into the daemon, without the manager knowing.

What it knows: the manager's seams — the Gate it takes slots from (`try_acquire`, and a slot's
`release` after a confirmed gone), the publish callable its events go through, the guard starter
it is given — and what the gate asks of the manager, through the manager's `Turns`
(supervisor.turns.manager: `grant_waiters`, `cancel`, the ledger's turns). What it does not know:
etcd (supervisor.cluster.gate) or how the manager grants.

- `ClusteredGate` wraps the machine's SlotGate: for a cluster key the cluster slot is asked first
  (no local slot is held while waiting on the cluster), then the local slot; the slot it returns
  gives both back on `release`. Every other key goes straight to the SlotGate.
- Waiting turns join the cluster queue when their `turn.<id>.queued` event passes through
  `publish` (so cluster order is request order, not the order turns reached their key's local
  head); a turn that stops waiting (`cancelled`, `rejected`) leaves it.
- A guard of a cluster turn gets `CCSUP_GUARD_DEADLINE_FILE` (guardd's --deadline-file default).
- The gate's `stop_turn` becomes `cancel(id, reason)`; its `wake`, `grant_waiters`
  (`ManagerListener`).

Wired in one direction: the `ClusterWiring` is made before the manager (the manager is made from
its gate, `publish` and `start_guard` wrappers); the daemon then subscribes a `ManagerListener`,
made with the manager, to the gate's `listeners` (as the admission follows the ledger's
observers), and nothing is set on either side afterwards. `start()` then begins the gate's lease:
the gate wakes and stops nothing before it.

State: none of its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config.cluster import ClusterSettings
from ..errors import CcsupError
from ..guards.handle import GuardSpec
from ..slots.gate import Slot, SlotGate, SlotView
from ..slots.views import KeyTally
from ..turns.manager import Turns
from ..turns.states import State
from ..wire.protocol import ProtocolError

if TYPE_CHECKING:  # supervisor.cluster.gate loads the etcd client: only with [cluster]
    from ..config import Config
    from .gate import ClusterGate

log = logging.getLogger("ccsup.cluster")

DEADLINE_ENV = "CCSUP_GUARD_DEADLINE_FILE"
_LEAVE_ON = ("cancelled", "rejected")


def cluster_wiring(
    config: Config, state_dir: Path, publish: Callable[[str, dict], None]
) -> ClusterWiring | None:
    """The wiring for a daemon whose config has [cluster]; None without it (nothing changes)."""
    if config.cluster is None:
        return None
    return ClusterWiring(config.cluster, state_dir=state_dir, grace=config.grace, publish=publish)


class ClusterSlot(Slot):
    """A local slot of a cluster key, whose release also gives the cluster slot back.

    It takes over the local Slot's state (its lock fd and record): the Slot it was made from is
    not used again, so the lock has one owner and is released once."""

    def __init__(self, local: Slot, cluster: ClusterGate, item_id: str):
        vars(self).update(vars(local))
        self._cluster = cluster
        self._item_id = item_id

    def release(self) -> None:
        """Only when the work is confirmed gone (as Slot.release)."""
        try:
            super().release()
        finally:
            self._cluster.release(self._item_id)

    def __repr__(self) -> str:
        return f"<ClusterSlot {self._item_id} {super().__repr__()}>"


class ClusteredGate:
    """The manager's Gate: a cluster slot first for cluster keys, then the local SlotGate's."""

    def __init__(self, local: SlotGate, cluster: ClusterGate):
        self.local = local
        self.cluster = cluster

    def try_acquire(
        self,
        key: str,
        holder: Any,
        *,
        turn: str | None = None,
        reservation: dict[str, Any] | None = None,
    ) -> Slot | None:
        if not self.cluster.is_cluster_key(key):
            return self.local.try_acquire(key, holder, turn=turn, reservation=reservation)
        item_id = turn if turn is not None else (reservation or {}).get("id")
        if item_id is None:
            return self.local.try_acquire(key, holder, turn=turn, reservation=reservation)
        if not self.cluster.try_take(key, item_id):
            self.local.last_refusal = "cluster_full"
            return None
        slot = self.local.try_acquire(key, holder, turn=turn, reservation=reservation)
        if slot is None:
            self.cluster.give_back(item_id)  # keeps its place; the local gate said why
            return None
        return ClusterSlot(slot, self.cluster, item_id)

    def inspect_all(self) -> list[SlotView]:
        return self.local.inspect_all()

    def adopt(self, *args: Any, **kwargs: Any) -> Any:
        """An adopted turn's local slot (supervisor.turns.adopt): cluster turns are never adopted."""
        return self.local.adopt(*args, **kwargs)

    def survey(self) -> tuple[list[SlotView], list[KeyTally]]:
        return self.local.survey()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.local, name)


class ClusterWiring:
    """Builds the ClusterGate for a daemon and the wrappers the manager is given."""

    def __init__(
        self,
        settings: ClusterSettings,
        *,
        state_dir: Path,
        grace: float,
        publish: Callable[[str, dict], None],
    ):
        from .gate import ClusterGate

        self.settings = settings
        self.deadline_file = state_dir / "cluster" / "deadline.json"
        self._publish = publish
        self.gate = ClusterGate(
            settings, deadline_file=self.deadline_file, grace=grace, publish=publish
        )

    # --- what the daemon gives the manager ----------------------------------------------------

    def slot_gate(self, local: SlotGate) -> ClusteredGate:
        return ClusteredGate(local, self.gate)

    def publish(self, topic: str, body: dict) -> None:
        """The manager's publish: cluster turns join and leave the cluster queue on the way."""
        parts = topic.split(".")
        if len(parts) == 3 and parts[0] == "turn":
            key = body.get("key")
            if isinstance(key, str) and self.gate.is_cluster_key(key):
                item_id, event = parts[1], parts[2]
                if body.get("reason") == "bound" and isinstance(body.get("turn"), str):
                    # A turn took this reservation's place or slot: the cluster entry follows.
                    self.gate.rebind(item_id, body["turn"])
                elif event == "queued":
                    holder = body.get("holder")
                    self.gate.join(key, item_id, holder if isinstance(holder, dict) else None)
                elif event in _LEAVE_ON:
                    self.gate.leave(item_id)
        self._publish(topic, body)

    def start_guard(self, start: Callable[[GuardSpec], Any]) -> Callable[[GuardSpec], Any]:
        """The guard starter, giving a cluster turn's guard the dead-man deadline file."""

        def start_guard(spec: GuardSpec) -> Any:
            if spec.turn_id in self.gate.entries:  # a cluster turn (or one bound to a reservation)
                # Not adopted (adopt_within 0): its capacity is leased from the cluster by this
                # supervisor, whose lease ends with it; the dead-man ends it anyway (docs/cluster.md).
                env = {**spec.env, DEADLINE_ENV: str(self.deadline_file)}
                spec = replace(spec, env=env, adopt_within=0.0)
            return start(spec)

        return start_guard

    def start(self) -> None:
        """Begin the gate's lease (on the event loop, once its listeners are subscribed)."""
        self.gate.start()

    async def close(self) -> None:
        await self.gate.close()

    def reload(self, settings: ClusterSettings) -> None:
        """A reload: new caps are written to etcd; other [cluster] changes need a restart."""
        if settings.caps != self.settings.caps:
            asyncio.get_running_loop().create_task(self.gate.set_caps(dict(settings.caps)))
        others = [
            name
            for name in (
                "etcd",
                "name",
                "lease_ttl",
                "prefix",
                "user",
                "password",
                "ca_file",
                "cert_file",
                "key_file",
                "insecure",
            )
            if getattr(settings, name) != getattr(self.settings, name)
        ]
        if others:
            log.warning("cluster: %s changed; restart the supervisor to apply", ", ".join(others))
        self.settings = settings

    async def status(self) -> dict[str, Any]:
        try:
            return dict(await self.gate.status())
        except CcsupError as e:
            return {"name": self.settings.name, "error": e.message}

    async def view(self) -> list[dict[str, Any]] | dict[str, str]:
        try:
            return [dict(v) for v in await self.gate.view()]
        except CcsupError as e:
            return {"error": e.message}


class ManagerListener:
    """The manager as the cluster gate's listener (supervisor.cluster.gate.Listener): a wake
    grants the waiters again, a stop cancels the turn. Made with the manager, whole."""

    def __init__(self, turns: Turns):
        self.turns = turns

    def wake(self) -> None:
        self.turns.grant_waiters()

    def stop_turn(self, turn_id: str, reason: str) -> None:
        try:
            self.turns.cancel(turn_id, reason=reason)
        except (ProtocolError, CcsupError) as e:  # a turn that ended meanwhile
            log.info("cluster: stopping turn %s: %s", turn_id, e)
            return
        # A turn granted but whose guard is not started yet ignores a cancel: ask again shortly
        # (its guard, if it starts, reads a deadline already past and stops on its own anyway).
        item = self.turns.ledger.turns.get(turn_id)
        if item is not None and item.state is State.GRANTED:
            asyncio.get_running_loop().call_later(0.05, self.stop_turn, turn_id, reason)
