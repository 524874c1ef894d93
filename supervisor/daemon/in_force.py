"""What a configuration puts in force, as flat `name -> text` pairs, and what a reload changed.

`settings(config, caps_override)` names each setting the way the config file spells it
(`slots.caps.codex`, `slots.rates.t`, `guard.grace`, `pause_on.codex.for`, ...), with the
--caps of `ccsup start` winning over the file's caps as they do in the gate. `changes(old, new)`
is the diff `ccsup reload` prints: `[{"name", "old", "new"}]`, sorted by name, None where a
setting is absent on one side. Pure: no I/O; endpoints are left out (a reload keeps them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict

from ..config import Config


class Change(TypedDict):
    name: str
    old: str | None
    new: str | None


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:g}s"


def settings(config: Config, caps_override: Mapping[str, int]) -> dict[str, str]:
    caps = config.caps.with_caps(caps_override)
    out: dict[str, str] = {"slots.default_cap": str(caps.default_cap)}
    for key, cap in caps.caps.items():
        origin = " (--caps)" if key in caps_override else ""
        out[f"slots.caps.{key}"] = f"{cap}{origin}"
    for harness, cap in caps.harness_default.items():
        out[f"harness.{harness}.default_cap"] = str(cap)
    if caps.machine_cap is not None:
        out["slots.machine_cap"] = str(caps.machine_cap)
    if caps.min_free_memory is not None:
        out["slots.min_free_memory"] = f"{caps.min_free_memory} bytes"
    out["guard.grace"] = _seconds(config.grace)
    out["guard.scan"] = _seconds(config.scan)
    out["reservation_ttl"] = _seconds(config.reservation_ttl)
    admission = config.admission
    out["slots.max_pause"] = _seconds(admission.max_pause)
    out["slots.fairness"] = admission.fairness
    out["slots.expiring_notice"] = _seconds(admission.expiring_notice)
    for key, rate in admission.rates.items():
        out[f"slots.rates.{key}"] = str(rate)
    for key, limit in admission.max_runtime.items():
        out[f"slots.max_runtime.{key}"] = _seconds(limit)
    for key, rule in admission.pause_on.items():
        if rule.stderr is not None:
            out[f"pause_on.{key}.stderr"] = rule.stderr.pattern
        if rule.exit_codes:
            out[f"pause_on.{key}.exit_codes"] = ",".join(map(str, sorted(rule.exit_codes)))
        out[f"pause_on.{key}.for"] = _seconds(rule.for_)
    for key, limits in config.limits.items():
        for name in ("memory_max", "pids_max", "cpu_max", "scope"):
            value = getattr(limits, name)
            if value is not None:
                out[f"limits.{key}.{name}"] = str(value)
    logs = config.logs
    for name in ("turn_max_bytes", "keep", "max_bytes"):
        value = getattr(logs, name)
        out[f"logs.{name}"] = "-" if value is None else str(value)
    if config.cluster is not None:
        for key, cap in config.cluster.caps.items():
            out[f"cluster.caps.{key}"] = str(cap)
    return out


def changes(old: Mapping[str, str], new: Mapping[str, str]) -> list[Change]:
    return [
        {"name": name, "old": old.get(name), "new": new.get(name)}
        for name in sorted(old.keys() | new.keys())
        if old.get(name) != new.get(name)
    ]
