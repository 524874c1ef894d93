"""The daemon: its wiring, signals, the periodic duties, and shutdown.

One asyncio process per state directory, holding its single-instance lock for its life
(supervisor.instance). Requests are routed by one table (supervisor.daemon.requests); systemd is
told READY and STOPPING (supervisor.daemon.systemd); the log is supervisor.daemon.logfile's.
Signals are turned into the same calls as the control commands (SIGTERM/SIGINT = quit, SIGHUP =
reload).

Start-up, in order: the sockets are bound (stale ipc socket files are replaced: we hold the
instance lock, so nobody else uses them) and `supervisor.started` is published; the guard zygote
starts; queue.json comes back (supervisor.turns.restore: `supervisor.restored` says what came back; a
bad file is moved aside and each problem is a `supervisor.error` event and a log line) and the
restored waiters are granted what is free; only then do the sockets serve requests, so no new
request can jump what was waiting before. After that, orphaned slots the last supervisor left
are reaped (`slot.<key>.orphaned`, `slot.<key>.reaped`; their work ends in a thread, so requests
are served meanwhile), the turns it was running are settled as their slots come free, and
waiters are granted again; then READY for systemd, and the periodic duties.

Periodic duties (`run_duty`): every RETRY_INTERVAL the manager's (expire_finished, save_state,
grant, confirm_ends), every scan interval a reap (in a task), every PRUNE_INTERVAL prune_logs, every
TRIM_INTERVAL trim_memory. Each run is on its own: whatever it raises is logged ("unable to
<operation> <object> (periodic duty <name>): <reason>", with the traceback) and counted in
`ccsup_periodic_errors_total{task}`, and the duty runs again at its next time; one failing duty
never keeps another from running (a duty that stopped at its first exception would leave grants,
reaps and confirmed ends undone until a restart).
Stopping half-way (SIGKILL): the guards see their parent gone and end their work; the next start
reaps whatever is left.

Size: past 600 lines and still one concept, the daemon's wiring and the life around it (the
order of start-up, signals, the periodic duties, shutdown); the request table, the instance lock,
systemd and the log file are modules of their own.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import logging.handlers
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ..admission.control import KeyControl, admission_settings
from ..admission.quota import ReadingError, Window, window_from_json
from ..admission.room import PEAKS, MachineRoom
from ..admission.room import REFRESH as ROOM_REFRESH
from ..caps import SlotState, cap_sources
from ..cluster.wiring import ClusterWiring, ManagerListener, cluster_wiring
from ..config import EMBEDDED_SOURCE, Config, last_start, load
from ..config.metrics import metrics_address
from ..errors import CcsupError
from ..guards import containment, fdlimit
from ..guards import waiting as guard_waiting
from ..guards.launcher import Launcher
from ..guards.strays import StrayWatch
from ..history import db as history_db
from ..history import metrics
from ..history import writer as history_writer
from ..holder import Holder
from ..instance import take_instance_lock
from ..output import retention
from ..paths import StatePaths, ipc_path
from ..slots.gate import SlotGate
from ..turns import restore, store, views
from ..turns.fairness import make_ordering
from ..turns.manager import RETRY_INTERVAL, Manager, Settings, Turns
from ..turns.states import State
from ..wire import args as command_args
from ..wire import protocol
from ..wire.protocol import ProtocolError, Request
from . import in_force, memtrim, requests, systemd
from .logfile import setup_logging

if TYPE_CHECKING:
    from .otel import SpanExporter
from .server import Server

log = logging.getLogger("ccsup.daemon")

HAND_OVER_SIGNAL = signal.SIGUSR2  # a hand-over, as `quit {"handover": true}` (contrib's unit)
HAND_OVER_STARTS_WAIT = 5.0  # seconds a hand-over waits for guards the zygote has not answered


class Daemon:
    def __init__(
        self,
        config: Config,
        paths: StatePaths,
        *,
        config_path: str | None,
        caps_override: dict | None,
    ):
        self.config = config
        self.paths = paths
        self.config_path = config_path
        self.caps_override = caps_override or {}
        endpoints = config.endpoints.resolve(paths.root)
        control, bus_in, bus_out = endpoints.control, endpoints.bus_in, endpoints.bus_out
        assert control and bus_in and bus_out  # resolve fills in every default
        # Guards publish their hints without keys: over CURVE tcp they get a private ipc bus-in.
        self._bus_in = bus_in if ipc_path(bus_in) is not None else paths.endpoint("guard-bus")
        guard_bus = None if self._bus_in == bus_in else self._bus_in
        self.server = Server(control, bus_in, bus_out, endpoints.curve, guard_bus)
        self.gate = SlotGate(paths.root, config.caps.with_caps(self.caps_override))
        # The supervisor is a child subreaper: a lost guard's strays that no zygote ends come to
        # it (supervisor.guards.strays), and are ended before that guard's exit is handed on.
        self.strays = StrayWatch()
        # Guards forked by a warm zygote (pipelined), else directly.
        self.launcher = Launcher(strays=self.strays)
        self.cgroups = containment.start_cgroups(config)
        # [cluster]: a cluster slot before the local one, for the keys it names (cluster_wiring).
        self.cluster = cluster = cluster_wiring(config, paths.root, self.server.publish)
        # Made by _make_admission while the manager is made (admission is given the manager whole).
        self.keyctl: KeyControl
        self.room: MachineRoom
        self.manager: Manager = Manager(
            paths=self.paths,
            gate=cluster.slot_gate(self.gate) if cluster else self.gate,
            publish=cluster.publish if cluster else self.server.publish,
            settings=self._settings(self.config),
            start_guard=(
                cluster.start_guard(self.launcher.start_guard)
                if cluster
                else self.launcher.start_guard
            ),
            # Admission (pauses, start rates, runtime limits, [memory]): made by the manager, given
            # the manager (_make_admission); the wait queue's order is [slots] fairness.
            admission=self._make_admission,
            ordering=make_ordering(admission_settings(config).fairness),
            # a pool's member held for quota is passed over ([quota] hold_at: supervisor.turns.pools)
            quota_room=lambda key, now: self.keyctl.quota_room(key),
            cgroups=self.cgroups,
        )
        if cluster:  # the cluster gate's wakes and stops go to the manager (ManagerListener)
            cluster.gate.listeners.append(ManagerListener(self.manager))
        self._stop = asyncio.Event()
        self.handing_over = False  # `ccsup restart`: exit without ending a turn (_hand_over)
        self._reaping: asyncio.Task | None = None
        self.history = history_writer.Recorder(paths.root)  # writes in a thread of its own
        self.server.observers.append(self.history.observe)
        self.launcher.on_truncated = self._log_truncated
        self.launcher.log_limit = self._log_limits().turn_max_bytes
        self.metrics: metrics.Metrics = metrics.Metrics(
            ps=lambda: views.ps(self.manager), memory=lambda: self.room.view()
        )
        self.server.observers.append(self.metrics.observe)
        self.otel: SpanExporter | None = None  # [otel] endpoint: a span per turn, off the loop
        if config.otel.endpoint:
            # Imported only when asked for: urllib.request brings hashlib and ssl, which a
            # supervisor otherwise never maps (tests/system/test_footprint.py).
            from .otel import SpanExporter

            self.otel = SpanExporter(config.otel.endpoint)
            self.server.observers.append(self.otel.observe)
        self.metrics_server: metrics.MetricsServer | None = None
        self.trimmer = memtrim.Trimmer()  # RSS: see supervisor.daemon.memtrim
        # The periodic duties by name (a test may wrap one to make it fail): see run_duty.
        self.duties = self._periodic_duties()
        for name in self.duties:
            self.metrics.periodic_errors.inc((name,), 0)

    def _make_admission(self, turns: Turns) -> KeyControl:
        """The manager's admission, called by the manager as it is made: the key control, with
        `[memory]`'s machine room (the last hold asked) in it; both follow the manager's ledger
        from here on."""
        self.room = MachineRoom(self.config.memory, turns, publish=self.server.publish)
        self.keyctl = KeyControl(
            admission_settings(self.config),
            self.paths.root,
            turns,
            publish=self.server.publish,
            clock=time.time,
            room=self.room,
        )
        return self.keyctl

    def _settings(self, config: Config) -> Settings:
        return Settings(
            grace=config.grace,
            scan=config.scan,
            bus_in=self._bus_in,
            config_source=config.source,
            reservation_ttl=config.reservation_ttl,
            adopt_within=config.adopt_within,
            pools=config.pools.pools,
            key_env=config.pools.env,
        )

    async def run(self) -> int:
        self.prepare_slots()  # before anything is served: a first burst only opens them
        self.server.bind()
        cluster = self.cluster
        if cluster:
            cluster.start()
            self._share_quota(cluster)
        self.history.start()
        self.server.publish(
            "supervisor.started", {"pid": os.getpid(), "state_dir": str(self.paths.root)}
        )
        log.info(
            "started on %s (pid %d, config %s)", self.paths.root, os.getpid(), self.config.source
        )
        self.strays.start(asyncio.get_running_loop())  # before any guard, zygote or page starts
        self.launcher.start()  # before restore, which may start guards
        await self._load_peaks()  # before restore: a restored waiter is granted by its prediction
        self.restore_queue()  # before any request is served: nothing new can jump what was waiting
        self.server.start(self.handle_request, self.handle_bus, self.handle_bad_bus)
        self._serve_metrics()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self.quit)
        loop.add_signal_handler(signal.SIGINT, self.quit)
        loop.add_signal_handler(signal.SIGHUP, self._reload_from_signal)
        loop.add_signal_handler(HAND_OVER_SIGNAL, self._hand_over_from_signal)
        await self.reap_orphans()
        systemd.notify("READY=1")
        web = _web_beside(self.config, self.paths.root, self.config_path)
        if web is not None:
            self.strays.own(web.pid)  # in a session of its own: ours, never a stray
        periodic = [
            asyncio.create_task(self._tick()),
            asyncio.create_task(self._every(lambda: retention.PRUNE_INTERVAL, ("prune_logs",))),
            asyncio.create_task(self._every(lambda: memtrim.TRIM_INTERVAL, ("trim_memory",))),
            asyncio.create_task(self._every(lambda: ROOM_REFRESH, ("memory_room",))),
        ]
        await self._stop.wait()
        systemd.notify("STOPPING=1")
        if self.handing_over:
            return await self._hand_over(periodic, web)
        self.server.publish("supervisor.stopping", {"pid": os.getpid()})
        log.info("stopping: ending every turn")
        self.manager.begin_stop()
        await self.manager.wait_idle()
        if cluster:
            await cluster.close()  # every turn is gone: the lease and its keys may go
        for task in periodic:
            task.cancel()
        if web is not None:
            from . import page

            await page.stop(web)
            self.strays.disown(web.pid)
        self.server.publish("supervisor.stopped", {"pid": os.getpid()})
        await self._close(handing_over=False)
        log.info("stopped")
        return 0

    async def _close(self, *, handing_over: bool) -> None:
        """Close every part, the sockets last: the last events get 50 ms to leave, spent closing
        the rest (the manager's file thread makes queue.json's last fsyncs). A hand-over keeps
        the turns' cgroups and leaves what runs below us to the next supervisor."""
        loop = asyncio.get_running_loop()
        sockets_close_at = loop.time() + 0.05
        self.manager.close()
        self.keyctl.close()
        self.launcher.close()
        if not handing_over:
            self.strays.close()  # every turn is gone: what is left below us has no one to count it
            self.cgroups.close()
        self.history.close()
        if self.otel is not None:
            self.otel.close()
        if self.metrics_server is not None:
            self.metrics_server.close()
        await asyncio.sleep(max(0.0, sockets_close_at - loop.time()))
        self.server.close()

    async def _hand_over(self, periodic: list[asyncio.Task], web: object) -> int:
        """`ccsup restart`'s old half: exit without ending a turn. Every guard is let go of
        untouched and waits for the next supervisor to adopt it ([guard] adopt_within); queue.json
        is saved whole, each running turn with the offsets of its output published so far; the
        zygote goes (its guards do not: they watch this process, not it), the turns' cgroups and
        the cluster lease stay (the lease expires on its own)."""
        manager = self.manager
        log.info("handing over: %d turn(s) running wait to be adopted", len(manager.turns))
        self.server.publish("supervisor.stopping", {"pid": os.getpid(), "handover": True})
        # Guards asked of the zygote and not answered yet: their answers are waited for, so that
        # no guard runs that this supervisor did not hand over.
        loop = asyncio.get_running_loop()
        until = loop.time() + HAND_OVER_STARTS_WAIT
        while (manager.starting_count() or self.launcher.waiting) and loop.time() < until:
            await asyncio.sleep(0.01)
        for task in periodic:
            task.cancel()
        if web is not None:
            from . import page

            await page.stop(web)  # type: ignore[arg-type]
        if self.cluster:
            await self.cluster.gate.close(revoke=False)  # its turns end with us; the lease expires
        let_go = manager.hand_over()  # from here on nothing of a turn changes or is published
        self.server.publish(
            "supervisor.stopped", {"pid": os.getpid(), "handover": True, "turns": let_go}
        )
        await self._close(handing_over=True)  # queue.json is on disk before we exit
        log.info("handed over %d turn(s)", let_go)
        return 0

    def prepare_slots(self) -> None:
        """The configured keys' slot files made ahead (SlotGate.prepare); a failure is only logged:
        a grant makes what is missing, and reports what it cannot make."""
        me = self.manager.me
        try:
            made = self.gate.prepare(Holder().held_by(me.pid, me.start))
        except (OSError, CcsupError) as e:
            log.warning("unable to make slot files ahead: %s", e)
        else:
            if made:
                log.info("made the files of %d slots ahead", made)

    def restore_queue(self) -> None:
        saved, problem = store.load(self.paths.queue)
        problems = [problem] if problem else []
        problems += self.keyctl.restore()  # pauses first: nothing restored is granted past one
        problems += restore.restore(self.manager, saved, self.gate.inspect_all())
        # Ends a SIGKILL took from the history's batch: written again from finished.log's lines.
        self.history.repair(self.manager.finished.ends())
        for text in problems:
            log.error("%s", text)
            self.server.publish(
                "supervisor.error", {"message": text, "path": str(self.paths.queue)}
            )
        restored = {
            "waiting": len(self.manager.queue),
            "reservations": len(self.manager.reservations),
            "lost": len(self.manager.ledger.lost_running),
            "adopted": self.manager.adoption.adopted,  # running turns taken over (turns.adopt)
            "problems": len(problems),
        }
        self.server.publish("supervisor.restored", restored)
        log.info("restored %s", restored)
        self.manager.grant_waiters()

    def quit(self) -> None:
        self._stop.set()

    def hand_over(self, force: bool = True) -> dict:
        """`quit {"handover": true}` (`ccsup restart`, SIGUSR2): stop taking requests and exit
        without ending a turn; the next supervisor adopts them. Refused (ProtocolError) when
        [guard] adopt_within is 0 (the turns would end) or a stop is already under way. `force`
        is accepted and changes nothing: turns on a terminal (-t) are adopted as any other."""
        adopt_within = self.config.adopt_within
        if adopt_within <= 0:
            raise ProtocolError(
                "failed",
                "restart needs [guard] adopt_within > 0: with 0 every running turn would end "
                f"with this supervisor (config {self.config.source}); use `ccsup stop` and "
                "`ccsup start`, or set adopt_within",
            )
        manager = self.manager
        if manager.stopping or self._stop.is_set():
            raise ProtocolError("stopping", "the supervisor is already stopping")
        running = [t for t in manager.turns.values() if t.state is not State.QUEUED]
        cluster = self.cluster
        # Not adopted, so they end with this supervisor: a cluster-capped turn (its lease is this
        # supervisor's).
        ending = [t for t in running if cluster and cluster.gate.is_cluster_key(t.key)]
        ending_ids = {t.id for t in ending}
        self.handing_over = True
        manager.begin_hand_over()
        asyncio.get_running_loop().call_soon(self.quit)
        return {
            "stopping": True,
            "handover": True,
            "pid": os.getpid(),
            "turns": len(running) - len(ending),  # to be adopted
            "ids": [t.id for t in running if t.id not in ending_ids],
            "ending": len(ending),  # cluster-capped: they end with this supervisor
            "waiting": len(manager.queue),  # restored by the next supervisor, in order
            "adopt_within": adopt_within,
        }

    def _hand_over_from_signal(self) -> None:
        """SIGUSR2 (systemd's KillSignal in contrib's unit): a hand-over; where adopt_within is
        0 a hand-over would end the turns anyway, so it is a plain stop, said in the log."""
        try:
            self.hand_over()
        except ProtocolError as e:
            if e.code == "stopping":
                return
            log.warning("%s: stopping every turn instead", e.message)
            self.quit()

    def _serve_metrics(self) -> None:
        """[metrics] listen: serve /metrics (off unless configured; an address it cannot take is
        logged and the supervisor runs on without it)."""
        listen = getattr(getattr(self.config, "metrics", None), "listen", None)
        if not listen:
            return
        try:
            host, port = metrics_address(listen)
            server = metrics.MetricsServer(self.metrics, host, port)
            server.start()
        except CcsupError as e:
            log.error("%s; no metrics are served", e.message)
            return
        self.metrics_server = server

    # -- output logs -----------------------------------------------------------------------------

    def _log_limits(self) -> retention.LogLimits:
        return getattr(self.config, "logs", None) or retention.LogLimits()

    def _log_truncated(self, turn_id: str, stream: str, offset: int, limit: int) -> None:
        fields = {"id": turn_id, "stream": stream, "offset": offset, "limit": limit}
        self.server.publish(f"turn.{turn_id}.truncated", fields)

    async def prune_logs(self) -> None:
        """[logs] keep and max_bytes (a periodic duty: at start, then every PRUNE_INTERVAL)."""
        limits = self._log_limits()
        running = set(self.manager.turns)
        pruned = await asyncio.to_thread(retention.prune, self.paths.turns, limits, running)
        if pruned:
            log.info("pruned the logs of %d turn(s)", len(pruned))
            self.history.mark_pruned([p["id"] for p in pruned], pruned[0]["pruned_at"])
        if limits.keep is not None:
            self.history.prune(time.time() - limits.keep)

    # -- periodic duties -------------------------------------------------------------------------

    def _periodic_duties(self) -> dict[str, tuple[str, Callable[[], object]]]:
        """name -> (what it does, for the log line; the duty, plain or async)."""
        duties: dict[str, tuple[str, Callable[[], object]]] = {
            name: (what, duty)
            for (name, duty), what in zip(
                self.manager.periodic_duties(),
                (
                    f"expire the finished ids of {self.paths.finished}",
                    f"save {self.paths.queue} and {self.paths.finished} again",
                    "grant the waiters",
                    "look again at the turns' ends",
                ),
                strict=True,
            )
        }
        duties["reap"] = (f"reap the orphaned slots of {self.gate.root}", self.reap_orphans)
        duties["prune_logs"] = (f"prune the turn logs in {self.paths.turns}", self.prune_logs)
        duties["trim_memory"] = ("give freed memory back to the kernel", self.trimmer.step)
        duties["memory_room"] = ("read the running turns' memory and PSI", self.room.refresh)
        return duties

    async def _load_peaks(self) -> None:
        """Each key's last peaks from the history (in a thread), for the memory predictions."""
        try:
            peaks = await asyncio.to_thread(history_db.recent_peaks, self.paths.root, PEAKS)
        except CcsupError as e:
            log.error("%s: memory predictions come from [memory] estimate alone", e.message)
            return
        self.room.load(peaks)

    async def run_duty(self, name: str) -> None:
        """One run of a periodic duty. Whatever it raises is logged (its operation and object, the
        traceback) and counted (ccsup_periodic_errors_total{task}); it runs again at its next time."""
        what, duty = self.duties[name]
        try:
            result = duty()
            if inspect.isawaitable(result):
                await result
        except Exception as e:  # noqa: BLE001 -- a periodic duty must outlive any bug or fault
            self.metrics.periodic_errors.inc((name,))
            log.error(
                "unable to %s (periodic duty %s): %s; it runs again at its next time",
                what,
                name,
                e,
                exc_info=True,
            )

    async def _every(self, interval: Callable[[], float], names: tuple[str, ...]) -> None:
        """Run these duties now, then every interval, each on its own."""
        while True:
            for name in names:
                await self.run_duty(name)
            await asyncio.sleep(interval())

    async def _tick(self) -> None:
        """Every RETRY_INTERVAL the manager's duties; every scan interval a reap, in a task."""
        elapsed = 0.0
        names = [name for name, _ in self.manager.periodic_duties()]
        while True:
            await asyncio.sleep(RETRY_INTERVAL)
            for name in names:
                await self.run_duty(name)
            elapsed += RETRY_INTERVAL
            if elapsed >= self.manager.settings.scan:
                elapsed = 0.0
                if self._reaping is None or self._reaping.done():
                    self._reaping = asyncio.create_task(self.run_duty("reap"))

    async def reap_orphans(self, key: str | None = None) -> list[dict]:
        """Find orphaned slots, end their work and release them (in a thread: it waits a grace)."""
        views = self.gate.inspect(key) if key else self.gate.inspect_all()
        if self.manager.ledger.lost_running:
            # A lost turn whose guard left by itself (not adopted, its command ended or its
            # dead-man ended it) frees its slot with nothing to reap: its story ends now.
            restore.settle_lost(self.manager, views if key is None else self.gate.inspect_all())
        orphans = [v for v in views if v.state is SlotState.ORPHANED]
        for view in orphans:
            self.server.publish(f"slot.{view.key}.orphaned", view.to_json())
        if not orphans:
            return []
        reaped = await asyncio.to_thread(self.gate.reap, key, grace=self.manager.settings.grace)
        for view in reaped:
            self.server.publish(f"slot.{view.key}.reaped", view.to_json())
        if reaped:
            if self.manager.ledger.lost_running:
                restore.settle_lost(self.manager, self.gate.inspect_all())
            self.manager.grant_waiters()
        return [view.to_json() for view in reaped]

    # -- the control socket ----------------------------------------------------------------------

    async def handle_request(self, request: Request) -> dict:
        """A control request, routed by the one table (supervisor.daemon.requests)."""
        try:
            return await requests.answer(self, request.cmd, request.args)
        except ProtocolError:
            raise
        except CcsupError as e:  # a bad config on reload is a usage error: the CLI exits 2
            raise ProtocolError(e.code, e.message) from None
        except Exception as e:  # a bug must not take the supervisor down with it
            log.exception("bug while answering %s", request.cmd)
            raise ProtocolError(
                "failed", f"internal error answering {request.cmd}: {type(e).__name__}; see the log"
            ) from None

    async def status(self) -> dict:
        result = views.status(self.manager)
        if self.cluster:
            result["cluster"] = await self.cluster.status()
        result["caps"] = dict(self.gate.caps.caps)
        result["default_cap"] = self.gate.caps.default_cap
        result.update(self._in_force())
        result["bus_rejected"] = self.server.rejected_bus_messages
        result["epoch"] = self.server.epoch  # the run its events name (supervisor.daemon.server)
        # How this supervisor was started, for `ccsup restart` to start the next one the same way
        result["started_with"] = {
            "config": (
                None
                if self.config.source == EMBEDDED_SOURCE
                else os.path.abspath(self.config.source)
            ),
            "caps": dict(self.caps_override),
            "systemd": systemd.notify_socket is not None,
        }
        result.update(self.cgroups.describe())
        result["memory"] = memory = self.room.view()
        if "memory" not in self.cgroups.controllers:
            memory["off"].append(
                "the memory controller (turns' cgroups have none here): each guard samples "
                "its tree's PSS at its scans"
            )
        # Guards that wait for adoption (not adopted at start: supervisor.turns.adopt), from their
        # records in a thread; our own guards' records are not read (we watch them).
        ours = {t.guard.record_path.name for t in self.manager.turns.values() if t.guard}
        found = await asyncio.to_thread(guard_waiting.survey, self.paths.guards, skip=ours)
        result.update(found.to_json())
        return result

    def _in_force(self) -> dict:
        """Each known key's cap and where it comes from, the rates and max_pause (for status)."""
        try:
            keys = set(self.gate.keys())  # configured, or with slot files: ever run here
        except CcsupError as e:
            log.warning("%s", e.message)
            keys = set(self.gate.caps.configured_keys())
        keys |= set(self.manager.queue.keys_by_age())
        pools = self.config.pools.pools
        keys -= set(pools)  # a pool has no cap of its own: its members have
        cluster_caps = self.config.cluster.caps if self.config.cluster else {}
        caps = cap_sources(self.config.caps, self.caps_override, sorted(keys | set(cluster_caps)))
        for entry in caps:
            if entry["key"] in cluster_caps:  # capped across machines too, the local cap under it
                entry["cluster_cap"] = cluster_caps[str(entry["key"])]
        settings = admission_settings(self.config)
        return {
            "caps_in_force": caps,
            "harness_default_caps": dict(self.gate.caps.harness_default),
            "pools": {name: list(members) for name, members in pools.items()},
            "rates": {key: str(rate) for key, rate in settings.rates.items()},
            "max_pause": settings.max_pause,
        }

    async def ps(self) -> dict:
        result = views.ps(self.manager)
        # What each running turn used so far: read from its guard record, in a worker thread.
        running = {t.id: t.guard.record_path for t in self.manager.turns.values() if t.guard}
        await asyncio.to_thread(containment.add_usage, result["slots"], running)
        for slot in result["slots"]:  # each running turn's key's predicted peak
            if slot.get("turn") in running:
                slot["predicted_mem"] = self.room.prediction(str(slot.get("key")))[0]
        if self.cluster:
            result["cluster"] = await self.cluster.view()
        return result

    async def reap(self, key: str | None) -> dict:
        return {"reaped": await self.reap_orphans(key)}

    def quota(self, args: command_args.QuotaArgs, *, source: str) -> dict:
        """`ccsup quota`, `request.quota`: show, take a reading of, or clear a key's windows."""
        if args.action == "show":
            return self.keyctl.quota_view(args.key)
        assert args.key is not None
        if not self._known_key(args.key):
            raise protocol.bad_request(
                f"key {args.key!r} is not configured and has never run here: no window is kept"
                " for it (check the spelling)",
            )
        if args.action == "clear":
            return self.keyctl.quota_clear(args.key, args.window, source=source)
        try:
            return self.keyctl.quota_set(
                args.key,
                args.window,
                args.used,
                args.resets_at,
                source=source,
                request_id=args.id,
            )
        except ReadingError as e:
            raise protocol.bad_request(str(e)) from None

    def _share_quota(self, cluster: ClusterWiring) -> None:
        """A cluster key's windows go to etcd, and come back from it (supervisor.cluster.quota)."""
        keyctl, gate = self.keyctl, cluster.gate

        def shared(key: str, windows: list[Window]) -> None:
            if gate.is_cluster_key(key):
                gate.quota.share(key, [dict(w.to_json()) for w in windows])

        def seen(key: str, window: str, value: dict | None) -> None:
            if not gate.is_cluster_key(key):
                return
            if value is None:
                keyctl.quota_clear(key, window, share=False)
                return
            read = window_from_json(value)
            if read is None or read.window != window:
                log.warning("cluster: the %s window of %s is malformed: skipped", window, key)
                keyctl.quota_skipped()
                return
            keyctl.quota_merge(key, [read])

        keyctl.quota_observers.append(shared)
        gate.quota.seen = seen

    def _known_key(self, key: str) -> bool:
        """Configured, with slot files (it ran here), waiting, running, or capped in the cluster."""
        try:
            known = set(self.gate.keys())
        except CcsupError:
            known = set(self.gate.caps.configured_keys())
        known |= set(self.manager.queue.keys_by_age())
        known |= {t.key for t in self.manager.turns.values()}
        if self.config.cluster:
            known |= set(self.config.cluster.caps)
        return key in known

    def quit_request(self, args: dict) -> dict:
        """`quit`: stop, `drain` (stop --drain) or `handover` (restart)."""
        what = command_args.parse_quit(args)
        if what == "handover":
            return self.hand_over(force=command_args.quit_force(args))
        if what == "drain":
            return self.drain()
        asyncio.get_running_loop().call_soon(self.quit)
        return {"stopping": True}

    def drain(self) -> dict:
        """`stop --drain`: grant nothing new and take no new turns; once the turns that hold a
        slot have ended on their own, stop as `quit` does (the waiters left are then cancelled,
        reason "shutdown"). Asked again, it answers how many still run."""
        manager = self.manager
        if not manager.draining:
            manager.draining = True
            log.info("draining: %d turn(s) running, no new grants", manager.running_count())

            def check(_item: object = None) -> None:
                if manager.running_count() == 0:
                    self.quit()

            manager.ledger.on_finished.append(check)
            asyncio.get_running_loop().call_soon(check)
        return {"stopping": True, "draining": True, "running": manager.running_count()}

    def reload(self) -> dict:
        config = load(self.config_path, os.environ)  # ConfigError: the old config stays
        before = in_force.settings(self.config, self.caps_override)
        self.config = config
        self.gate.caps = config.caps.with_caps(self.caps_override)
        # A raised cap's new slot files, made in a thread; waiters are tried again once they are
        # there (a grant that met an index being made saw it busy).
        made = asyncio.get_running_loop().run_in_executor(None, self.prepare_slots)
        made.add_done_callback(lambda _: self.manager.grant_waiters())
        if self.cluster and config.cluster:
            self.cluster.reload(config.cluster)
        self.manager.settings = self._settings(config)
        self.launcher.log_limit = self._log_limits().turn_max_bytes
        self.keyctl.retune(admission_settings(config))
        self.room.retune(config.memory)
        for sentence in self.cgroups.set_limits(dict(config.limits)):  # [guard] cgroup: at start
            log.warning("%s", sentence)
        changed = in_force.changes(before, in_force.settings(config, self.caps_override))
        self.server.publish("supervisor.reloaded", {"config": config.source, "changed": changed})
        log.info("reloaded %s (%d changes)", config.source, len(changed))
        self.manager.grant_waiters()  # a raised cap may admit waiters now
        return {"config": config.source, "changed": changed}

    def _reload_from_signal(self) -> None:
        try:
            self.reload()
        except CcsupError as e:
            log.error("reload refused, the old configuration stays: %s", e.message)

    # -- the bus ---------------------------------------------------------------------------------

    def handle_bus(self, topic: str, body: dict) -> None:
        if topic.startswith("guard."):
            self.manager.on_guard_hint(topic, body)
            return
        kind = protocol.REQUEST_TOPICS.get(topic)
        if kind is None:
            return
        req_id = body.get("id")
        try:
            protocol.check_id(req_id)
            requests.take(self, kind, body)
        except (ProtocolError, CcsupError) as e:
            if isinstance(req_id, str) and protocol.TURN_ID.match(req_id):
                self.manager.reject(req_id, e.message)
            else:
                self.handle_bad_bus(topic, body, e.message)

    def handle_bad_bus(self, topic: str, body: dict | None, reason: str) -> None:
        log.warning("ignored a bad bus message on %r: %s", topic[:64], reason)


def _web_beside(config: Config, state_dir: Path, config_path: str | None):
    """`[web] listen`: the page's process, started beside the daemon (supervisor.daemon.page)."""
    if config.web.listen is None:
        return None
    from . import page

    return page.start(state_dir, config_path)


def serve(
    config: Config,
    state_dir: Path,
    *,
    caps_override: dict | None = None,
    foreground: bool = True,
    config_path: str | None = None,
    lock_wait: float = 0.0,
    ready_fd: int | None = None,
) -> int:
    """Run the daemon in this process until it is told to stop; returns the exit code.
    lock_wait: seconds to wait for the state directory's lock (supervisor.instance.take_instance_lock); ready_fd:
    closed once this process is ready to take it (`ccsup restart` hands over only then)."""
    systemd.take_notify_socket()
    paths = StatePaths(Path(state_dir))
    paths.ensure()
    if ready_fd is not None:
        os.close(ready_fd)  # every import done: what is left is quick (`ccsup restart`)
    lock_fd = take_instance_lock(paths, lock_wait)
    setup_logging(paths, foreground)
    try:  # how this one was started: for `ccsup restart` and a later `start` (last_start)
        source = None if config.source == EMBEDDED_SOURCE else os.path.abspath(config.source)
        last_start.record(paths.root, source, dict(caps_override or {}))
    except OSError as e:
        logging.getLogger("ccsup").warning("unable to write %s: %s", last_start.FILE_NAME, e)
    fdlimit.raise_nofile()  # 500 turns need ~5k fds; each turn gets the old limit back
    try:
        daemon = Daemon(config, paths, config_path=config_path, caps_override=caps_override)
        code = asyncio.run(daemon.run())
    finally:
        os.close(lock_fd)
    if daemon.handing_over:
        # Everything is saved and closed; the next supervisor waits for this process to be gone
        # (its slot locks with it), so it exits now, not after the interpreter has freed every
        # object of 500 turns one by one.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code
