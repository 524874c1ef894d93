"""A turn's containment as the supervisor sees it, off the event loop: guard records read in a
worker thread, and the turn's cgroup (where a writable cgroup2 hierarchy is in use).

Design note. A big turn's guard record holds hundreds of groups (a few ms to parse), and its
cgroup's checks are file reads; neither belongs on the event loop when it grows with the turn, so
the blocking functions here are called through asyncio.to_thread by supervisor.turns.endings and
supervisor.turns.gone. They only read (or, for a cgroup, kill and remove what is confirmed gone), so
running one twice, or abandoning it half-way, is harmless.

Knows guard records (guardd.record) and cgroups (guardd.cgroup); nothing of slots or the bus.
Holds no state.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from guardd import cgroup
from guardd.record import RecordError, read_json

from ..caps import SlotState

log = logging.getLogger("ccsup.containment")


def read_record(record_path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """Blocking: a guard record, None when it cannot be read (not written yet, or being replaced:
    the next look finds it)."""
    try:
        return read_json(record_path)
    except (OSError, RecordError):
        return None


# -- what a turn used ---------------------------------------------------------------------------

USAGE_FIELDS = ("cpu_user_s", "cpu_system_s", "peak_rss_bytes", "processes", "peak_mem")


def usage_fields(
    record: dict[str, Any] | None, requested_at: float, started_at: float | None, now: float
) -> dict[str, Any]:
    """The figures `turn.<id>.exited` carries, each named with its unit: wall_s (guard start to
    now), wait_s (request to guard start: the time waited for the slot), and the guard's
    `usage` (guardd.usage): cpu_user_s, cpu_system_s, peak_rss_bytes, processes, peak_mem (the
    whole tree's peak memory); None where not known (no record)."""
    used = (record or {}).get("usage")
    used = used if isinstance(used, dict) else {}
    fields: dict[str, Any] = {
        "wall_s": None if started_at is None else round(now - started_at, 6),
        "wait_s": None if started_at is None else round(max(0.0, started_at - requested_at), 6),
    }
    for name in USAGE_FIELDS:
        value = used.get(name)
        fields[name] = value if isinstance(value, int | float) else None
    return fields


def usage_so_far(record_path: str | os.PathLike[str] | None) -> dict[str, Any] | None:
    """A running turn's figures as its guard last wrote them (at most a second old, or a scan)."""
    if record_path is None:
        return None
    record = read_record(record_path)
    used = (record or {}).get("usage")
    return used if isinstance(used, dict) else None


def add_usage(slots: list[dict[str, Any]], running: dict[str, Any]) -> None:
    """Blocking (a worker thread): `usage` so far on each slot whose turn runs here (`ps`)."""
    for slot in slots:
        path = running.get(slot.get("turn") or "")
        if path is not None and slot.get("state") == SlotState.HELD:
            slot["usage"] = usage_so_far(path)


# -- the turns' cgroups --------------------------------------------------------------------------

OFF = "off"
AUTO = "auto"


class Cgroups:
    """Where this supervisor puts its turns' cgroups, or why it does not (`[guard] cgroup`).

    `base` is the writable cgroup2 directory found (auto) or named (a path); each supervisor makes
    one parent below it, `ccsup.<pid>.<start ticks>`, and a cgroup per turn in that parent. With
    no base, turns are contained by the guard's subreaper + process groups alone (`mode` groups).
    """

    def __init__(self, setting: str, base: str | None, why: str | None, parent: str | None):
        self.setting = setting
        self.base = base
        self.why = why  # why cgroups are not used (None when they are)
        self.parent = parent
        self.limits: dict[str, Any] = {}  # key -> config.limits.Limits
        self.controllers: set[str] = set()  # what turns' cgroups may use (delegated to `base`)

    @property
    def mode(self) -> str:
        return "cgroup" if self.parent is not None else "groups"

    @classmethod
    def start(cls, setting: str, pid: int, start: int) -> Cgroups:
        """Resolve the setting now (a path was checked by the config already, and is checked
        again: a hierarchy can change under a running system). Removes stale parents of dead
        supervisors (empty ones only)."""
        if setting == OFF:
            return cls(setting, None, '[guard] cgroup = "off"', None)
        if setting == AUTO:
            base = cgroup.find_auto()
            if base is None:
                why = "no writable cgroup2 hierarchy found (auto): subreaper and process groups"
                return cls(setting, None, why, None)
        else:
            base = setting
            problem = cgroup.usable(base)
            if problem is not None:
                raise cgroup.CgroupError(0, f"[guard] cgroup: {problem}")
        cgroup.remove_stale_parents(base, _supervisor_running)
        return cls(setting, base, None, cgroup.supervisor_parent(base, pid, start))

    def describe(self) -> dict[str, Any]:
        """For `status`: which containment runs, and where or why not; each key's limits."""
        return {
            "containment": self.mode,
            "cgroup": self.parent,
            "cgroup_why_not": self.why,
            "limits": self.limits_report(),
        }

    def set_limits(self, limits: dict[str, Any]) -> list[str]:
        """Take `[limits.<key>]` (at start and reload); returns a sentence per limit that is not
        enforced here, for the log (status and config check say the same)."""
        self.limits = dict(limits)
        if self.base is not None:
            self.controllers = set(_words(os.path.join(self.base, "cgroup.subtree_control")))
        report = self.limits_report()
        return [
            f"limits.{key}.{name}: not enforced: {why}"
            for key, entry in report.items()
            for name, why in entry["not_enforced"].items()
        ]

    def limits_report(self) -> dict[str, dict[str, Any]]:
        """Per key: the limits enforced, and each one not enforced with why not."""
        report = {}
        for key, limits in self.limits.items():
            enforced: list[str] = []
            missing: dict[str, str] = {}
            for name, controller in (
                ("memory_max", "memory"),
                ("pids_max", "pids"),
                ("cpu_max", "cpu"),
            ):
                if getattr(limits, name) is None:
                    continue
                if controller in self.controllers:
                    enforced.append(name)
                else:
                    missing[name] = self.why or (
                        f"the {controller} controller is not delegated to {self.base}"
                    )
            report[key] = {"enforced": enforced, "not_enforced": missing}
        return report

    def turn_path(self, turn_id: str, key: str | None = None) -> str | None:
        """The cgroup a turn's guard runs CMD in, or None without cgroups. With limits for the
        key, the cgroup (or the key's shared one, scope key) is made here and the limits written
        before the guard starts; otherwise the guard creates it. OSError when a limit that the
        controller allows cannot be written (the turn then does not start)."""
        if self.parent is None:
            return None
        limits = self.limits.get(key or "")
        files = {
            name: value
            for name, value in (limits.files().items() if limits is not None else ())
            if name.split(".")[0] in self.controllers
        }
        if limits is None or not files:
            return cgroup.turn_cgroup(self.parent, turn_id)
        controllers = sorted({name.split(".")[0] for name in files})
        cgroup.create(self.parent)
        _write(
            os.path.join(self.parent, "cgroup.subtree_control"),
            " ".join(f"+{c}" for c in controllers),
        )
        if limits.scope == "key":
            holder = os.path.join(self.parent, f"key.{key}")
            os.makedirs(holder, exist_ok=True)
            path = cgroup.turn_cgroup(holder, turn_id)
        else:
            holder = path = cgroup.turn_cgroup(self.parent, turn_id)
            cgroup.create(path)
        for name, value in files.items():
            _write(os.path.join(holder, name), value)
        if limits.scope == "key":
            cgroup.create(path)
        return path

    def close(self) -> None:
        """At the supervisor's stop: remove its parent (only when every turn cgroup is gone)."""
        if self.parent is not None:
            try:
                cgroup.remove(self.parent)
            except OSError:
                pass  # a turn cgroup still in it: the next supervisor's reaper finishes it


def check_setting(setting: str) -> str | None:
    """For `config check`: None when the setting can be used here, else the problem (a path
    that is not a writable cgroup2 directory). `auto` is never a problem: it falls back."""
    if setting in (AUTO, OFF):
        return None
    problem = cgroup.usable(setting)
    return None if problem is None else f"[guard] cgroup: {problem}"


def describe_setting(setting: str) -> str:
    """For `config check`: what the setting gives on this machine, in words."""
    if setting == OFF:
        return "off: subreaper and process groups"
    base = cgroup.find_auto() if setting == AUTO else setting
    if base is None:
        return "auto: no writable cgroup2 hierarchy here: subreaper and process groups"
    return f"{setting}: a cgroup per turn under {base}"


def limits_not_enforced(config: Any) -> list[str]:
    """For `config check`: a sentence per configured limit this machine would not enforce
    (no cgroups, or its controller not delegated). Looks, changes nothing."""
    if not config.limits:
        return []
    setting = config.guard_cgroup
    base = None if setting == OFF else cgroup.find_auto() if setting == AUTO else setting
    why = '[guard] cgroup = "off"' if setting == OFF else None
    if base is None and why is None:
        why = "no writable cgroup2 hierarchy found (auto)"
    return Cgroups(setting, base, why, None).set_limits(dict(config.limits))


def start_cgroups(config: Any) -> Cgroups:
    """The daemon's Cgroups from `[guard] cgroup` (default auto); a configured path that is not
    usable is a configuration error (exit 2), naming the key."""
    from guardd.procs import identity_of

    from ..errors import ConfigError

    me = identity_of(os.getpid())
    assert me is not None  # this very process
    setting = config.guard_cgroup
    try:
        cgroups = Cgroups.start(setting, me.pid, me.start)
    except OSError as e:
        raise ConfigError(str(e)) from None
    if cgroups.why is not None:
        log.info("turns are contained without cgroups: %s", cgroups.why)
    else:
        log.info("each turn runs in a cgroup under %s", cgroups.parent)
    for sentence in cgroups.set_limits(dict(config.limits)):
        log.warning("%s", sentence)  # never silently ignored: status says it too
    return cgroups


def _words(path: str) -> list[str]:
    try:
        with open(path, "rb") as f:
            return f.read().decode().split()
    except OSError:
        return []


def _write(path: str, value: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(value)
    except OSError as e:
        raise cgroup.CgroupError(
            e.errno, f"unable to write {value!r} to {path}: {e.strerror}"
        ) from None


def oom_killed(path: str | None) -> bool:
    """Did the kernel's OOM killer end something in this cgroup (memory.events oom_kill)?"""
    if not path:
        return False
    try:
        return cgroup.read_keyed(os.path.join(path, "memory.events")).get("oom_kill", 0) > 0
    except OSError:
        return False


def _supervisor_running(pid: int, start: int) -> bool:
    from guardd.procs import Identity, process_running

    return process_running(Identity(pid, start))


def cgroup_populated(path: str) -> bool:
    """Blocking but constant: `populated 1` in the cgroup's cgroup.events (missing: empty)."""
    try:
        return cgroup.populated(path)
    except OSError:
        return True  # unreadable: not known to be empty


def remove_cgroup(path: str | None) -> None:
    """After the release: rmdir the turn's cgroup (refused by the kernel while populated)."""
    if not path:
        return
    try:
        if not cgroup.remove(path):
            log.warning("unable to remove cgroup %s: it still holds processes", path)
            return
        parent = os.path.dirname(path)
        owner = os.path.basename(parent)[len(cgroup.PARENT_PREFIX) :].split(".")
        if os.path.basename(parent).startswith(cgroup.PARENT_PREFIX) and len(owner) == 2:
            if all(p.isdigit() for p in owner) and not _supervisor_running(*map(int, owner)):
                cgroup.remove(parent)  # a dead supervisor's parent, once its last turn is reaped
    except OSError as e:
        log.warning("%s", e)
