"""ccsup's configuration: find the TOML file, parse and validate it, fill in defaults.

`parse(text, source, env)` is pure: it reads nothing but its arguments and validates everything
(unknown keys, types, caps, cap keys, durations, sizes, endpoints). It collects every problem it
can find in one pass and raises one ConfigProblems (a ConfigError, exit code 2) that lists them,
each naming the file, the dotted key (`slots.caps."opencode:xai"`) and the line. `load()` is the
only function that reads a file (through `files.read_text`); `find_config_path()` and
`resolve_state_dir()` only look at the environment mapping given and whether the XDG file exists.

State: none of its own. Loading again reads the file again (a `reload` sees the new text); a file
that is half-written, empty or from a newer ccsup is validated like any other text: an empty file
means every default, an unknown key is an error naming it, never silently ignored. With no file
found, the embedded `supervisor/config/default.toml` serves.

The modules: `schema` (Section/Key, the Checker that collects problems with their lines),
`values` (durations, sizes, caps, strings), one module per section (`top`, `slots`, `guard`,
`endpoints`, `harness`, `cluster`, `pools`, ...), `files` (finding and reading the file, the state directory) and
`template` (the commented default `ccsup config init` writes).

How to add a section, say `[logs]`:
1. A module `supervisor/config/logs.py` with `SECTION = Section(("logs",), doc, (Key(...), ...))`
   (every key with its default, or an example value and `example=True` when it is optional) and
   `parse_logs(c: Checker, top: Table) -> Logs`, reading its table with `c.table(top, ("logs",))`
   (which reports unknown keys) and each value with `c.run(path, check, value)` (which records the
   problem with its key and line instead of raising). `Logs` is a small frozen dataclass or
   NamedTuple with a default for every field.
2. `SECTION` appended to `SECTIONS` below: the key becomes known and `config init` documents it.
3. A field on `Config` with a default (`logs: Logs = Logs()`), set in `parse()` with one line.
4. Regenerate the embedded default (test_config says how).
A table of named tables (`[limits.<key>]`, `[pause_on.<key>]`) has a path ending in "*" and
checks each entry with `c.table(table, path, schema=SECTION.path)`: see `harness.py`. A new key
of an existing section (`[slots] rates`) is a `Key` in that section's SECTION, a field on its
result and on `Config`.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

from ..caps import Caps
from . import (
    admission,
    cluster,
    endpoints,
    guard,
    harness,
    hooks,
    limits,
    logs,
    memory,
    metrics,
    otel,
    pools,
    quota,
    slots,
    top,
    web,
    wrap,
)
from .admission import AdmissionSettings
from .endpoints import MAX_IPC_PATH, CurveKeys, Endpoints
from .files import (
    EMBEDDED_SOURCE,
    embedded_text,
    find_config_path,
    read_text,
    resolve_state_dir,
    xdg_config_path,
)
from .guard import DEFAULT_GRACE, DEFAULT_SCAN
from .harness import Harness
from .hooks import HookSettings
from .logs import LogLimits
from .memory import MemorySettings
from .metrics import MetricsSettings
from .pools import Pools
from .schema import Checker, ConfigProblems, Problem, Section, syntax_problem
from .slots import DEFAULT_CAP, DEFAULT_RESERVATION_TTL, TTL_ENV
from .values import duration, size
from .web import WebSettings

if TYPE_CHECKING:
    from .cluster import ClusterSettings

__all__ = [
    "DEFAULT_CAP",
    "DEFAULT_GRACE",
    "DEFAULT_RESERVATION_TTL",
    "DEFAULT_SCAN",
    "EMBEDDED_SOURCE",
    "MAX_IPC_PATH",
    "SECTIONS",
    "TTL_ENV",
    "Config",
    "ConfigProblems",
    "CurveKeys",
    "Endpoints",
    "Harness",
    "Problem",
    "default_config_text",
    "embedded_text",
    "find_config_path",
    "load",
    "parse",
    "duration",
    "size",
    "resolve_state_dir",
    "xdg_config_path",
]

# Every section, in the order `config init` writes them.
SECTIONS: tuple[Section, ...] = (
    top.SECTION,
    slots.SECTION,
    guard.SECTION,
    endpoints.SECTION,
    endpoints.CURVE_SECTION,
    harness.SECTION,
    limits.SECTION,
    web.SECTION,
    logs.SECTION,
    metrics.SECTION,
    admission.PAUSE_ON_SECTION,
    quota.SECTION,
    cluster.SECTION,
    memory.SECTION,
    hooks.SECTION,
    wrap.SECTION,
    pools.SECTION,
    pools.ENV_SECTION,
    otel.SECTION,
)


@dataclass(frozen=True)
class Config:
    source: str  # the file path, or "<embedded defaults>"
    state_dir: Path | None  # from the file (~ expanded); None when the file does not set it
    caps: Caps
    reservation_ttl: float  # seconds; $CCSUP_RESERVATION_TTL_MS wins
    grace: float
    scan: float
    endpoints: Endpoints
    harness: Mapping[str, Harness] = field(default_factory=dict)
    guard_cgroup: str = "auto"  # [guard] cgroup: "auto", "off" or a path
    adopt_within: float = guard.DEFAULT_ADOPT_WITHIN  # [guard] adopt_within, seconds
    limits: Mapping[str, limits.Limits] = field(default_factory=dict)  # [limits.<key>]
    web: WebSettings = WebSettings()
    logs: LogLimits = logs.DEFAULTS  # [logs]
    metrics: MetricsSettings = MetricsSettings()
    admission: AdmissionSettings = field(default_factory=AdmissionSettings)  # config/admission.py
    cluster: ClusterSettings | None = (
        None  # [cluster]: caps across machines (supervisor.cluster.gate)
    )
    hooks: HookSettings = HookSettings()  # [hooks]: supervisor.agents' shell-command hook
    memory: MemorySettings = field(default_factory=MemorySettings)  # [memory]: the machine's room
    wrap: wrap.WrapSettings = wrap.WrapSettings()  # [wrap]: `ccsup wrap`'s key and its cap
    otel: otel.OtelSettings = otel.OtelSettings()  # [otel]: spans of turns (supervisor.daemon.otel)
    pools: Pools = Pools()  # [pools] and [env."<key>"]: config/pools.py

    def __post_init__(self) -> None:
        object.__setattr__(self, "harness", MappingProxyType(dict(self.harness)))


def parse(text: str, source: str, env: Mapping[str, str] = {}) -> Config:
    """Validate a configuration's text. Pure: no I/O. Raises ConfigProblems listing every problem."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigProblems([syntax_problem(err, text, source)]) from None
    c = Checker(text, source, SECTIONS)
    table = c.table(data, ())
    state_dir = top.parse_state_dir(c, table, env)
    slot_settings = slots.parse_slots(c, table, env)
    guard_settings = guard.parse_guard(c, table)
    endpoint_settings = endpoints.parse_endpoints(c, table)
    harnesses = harness.parse_harness(c, table)
    key_limits = limits.parse_limits(c, table)
    web_settings = web.parse_web_section(c, table)
    log_limits = logs.parse_logs(c, table)
    metrics_settings = metrics.parse_metrics(c, table)
    admission_settings = admission.parse_admission(c, table)
    cluster_settings = cluster.parse_cluster(c, table, guard_settings.grace, env)
    hook_settings = hooks.parse_hooks(c, table)
    wrap_settings = wrap.parse_wrap(c, table)
    otel_settings = otel.parse_otel(c, table)
    named = set(slot_settings.caps) | set(harnesses)
    named |= set(cluster_settings.caps) if cluster_settings is not None else set()
    memory_settings = memory.parse_memory(c, table, named)
    cluster_caps = cluster_settings.caps if cluster_settings is not None else {}
    pool_settings = pools.parse_pools(c, table, slot_settings.caps, cluster_caps, env)
    c.raise_problems()
    # With no problem recorded, no value is None.
    assert slot_settings.default_cap is not None and slot_settings.reservation_ttl is not None
    assert guard_settings.grace is not None and guard_settings.scan is not None
    harness_default = {
        name: h.default_cap for name, h in harnesses.items() if h.default_cap is not None
    }
    harness_default.setdefault(wrap_settings.key.partition(":")[0], wrap_settings.cap)
    return Config(
        source=source,
        state_dir=state_dir,
        caps=Caps(
            slot_settings.default_cap,
            slot_settings.caps,
            harness_default,
            slot_settings.machine_cap,
            slot_settings.min_free_memory,
        ),
        reservation_ttl=slot_settings.reservation_ttl,
        grace=guard_settings.grace,
        scan=guard_settings.scan,
        endpoints=endpoint_settings,
        harness=harnesses,
        guard_cgroup=guard_settings.cgroup or "auto",
        adopt_within=(
            guard.DEFAULT_ADOPT_WITHIN
            if guard_settings.adopt_within is None
            else guard_settings.adopt_within
        ),
        limits=key_limits,
        web=web_settings,
        logs=log_limits,
        metrics=metrics_settings,
        admission=admission_settings,
        cluster=cluster_settings,
        hooks=hook_settings,
        memory=memory_settings,
        wrap=wrap_settings,
        pools=pool_settings,
        otel=otel_settings,
    )


def load(
    cli_path: str | None = None, env: Mapping[str, str] = os.environ, *, embedded: bool = False
) -> Config:
    """Find, read and parse the configuration; `embedded`: the embedded defaults, whatever files
    exist (a supervisor started by `ccsup start` or `restart` whose caller found no file)."""
    path = None if embedded else find_config_path(cli_path, env)
    if path is None:
        return parse(embedded_text(), EMBEDDED_SOURCE, env)
    return parse(read_text(path), str(path), env)


def default_config_text() -> str:
    """The commented default configuration that `ccsup config init` writes.

    Every key is explained; optional keys are shown commented out with an example value. Parsed,
    it gives the embedded defaults (supervisor/config/default.toml is this very text).
    """
    from .template import render  # tomli-w, only for `config init` and its tests

    return render(SECTIONS)
