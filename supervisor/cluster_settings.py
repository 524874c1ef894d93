"""What `[cluster]` says, as one value: the etcd members, this machine's name, the lease, the key
prefix and the cluster caps. Pure: no I/O (supervisor.cluster does the talking).

A key is a cluster key when it is named in `caps`, or when it is `harness:variant` and its bare
harness is named there (each such key capped on its own, as in `[slots]`); every other key stays
machine-local.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # supervisor.etcd (http.client, ssl) costs ~20 ms: loaded only with [cluster]
    from .etcd import EtcdSettings

DEFAULT_LEASE_TTL = 10.0
DEFAULT_PREFIX = "/ccsup"
MACHINE_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}\Z")
# The guard starts its stop this long before grace + margin end at the lease deadline; covers the
# guard's own wake-up and kill latency and the machines' clock rates drifting apart over a TTL.
FENCE_MARGIN = 0.5


def default_name() -> str:
    return os.uname().nodename.split(".")[0] or "localhost"


@dataclass(frozen=True)
class ClusterSettings:
    etcd: tuple[str, ...]
    name: str = field(default_factory=default_name)
    lease_ttl: float = DEFAULT_LEASE_TTL
    prefix: str = DEFAULT_PREFIX
    caps: Mapping[str, int] = field(default_factory=dict)
    user: str | None = None
    password: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    insecure: bool = False
    timeout: float = 2.0

    def __post_init__(self):
        object.__setattr__(self, "caps", MappingProxyType(dict(self.caps)))
        object.__setattr__(self, "prefix", self.prefix.rstrip("/") or DEFAULT_PREFIX)

    def etcd_settings(self) -> EtcdSettings:
        from .etcd import EtcdSettings

        return EtcdSettings(
            endpoints=tuple(self.etcd),
            user=self.user,
            password=self.password,
            ca_file=self.ca_file,
            cert_file=self.cert_file,
            key_file=self.key_file,
            insecure=self.insecure,
            timeout=self.timeout,
        )

    def cap_entry(self, key: str) -> str | None:
        """The entry of `caps` that makes `key` a cluster key (itself or its harness), else None."""
        if key in self.caps:
            return key
        harness, sep, _ = key.partition(":")
        if sep and harness in self.caps:
            return harness
        return None

    def is_cluster_key(self, key: str) -> bool:
        return self.cap_entry(key) is not None

    def renew_interval(self, grace: float) -> float:
        """How often the lease is renewed: a third of the TTL, and at least twice in the time a
        renewal may be late before turns must begin to stop."""
        return min(self.lease_ttl / 3, self.stop_window(grace) / 2)

    def stop_window(self, grace: float) -> float:
        """From a keep-alive's send time to the moment turns must begin to stop."""
        return self.lease_ttl - grace - FENCE_MARGIN


def timing_problem(lease_ttl: float, grace: float) -> str | None:
    """Why a lease TTL cannot fence turns whose guards have this grace, or None."""
    if lease_ttl - grace - FENCE_MARGIN < lease_ttl / 3:
        need = 1.5 * (grace + FENCE_MARGIN)
        return (
            f"a lease_ttl of {lease_ttl:g}s leaves too little time to renew the lease before"
            f" turns must begin to stop ([guard] grace {grace:g}s + {FENCE_MARGIN:g}s before the"
            f" lease deadline): make lease_ttl at least {need:g}s or the grace shorter"
        )
    if lease_ttl < 1:
        return f"a lease_ttl of {lease_ttl:g}s is below etcd's minimum of 1s"
    return None


# --- `[cluster]` from a parsed TOML table --------------------------------------------------------

_PREFIX = re.compile(r"(/[A-Za-z0-9._-]+)+\Z")

Report = Callable[[tuple, str], None]  # (key path, message): one problem with the config


def parse_cluster(
    table: Mapping[str, object],
    report: Report,
    *,
    grace: float | None,
    env: Mapping[str, str],
    hostname: Callable[[], str] = default_name,
) -> ClusterSettings | None:
    """`[cluster]` (already read from TOML) as ClusterSettings; every problem goes to report(path,
    message). Pure: durations, caps and keys are judged by the same functions as elsewhere.
    grace: the guards' grace, which the lease must leave room for (None when itself invalid)."""
    from .caps import check_cap, key_problem  # the one place that says what a key and a cap are
    from .config.values import duration  # imported here: supervisor.config imports this module
    from .errors import UsageError
    from .etcd import PASSWORD_ENV, EtcdError, check_endpoint

    ok = True

    def bad(name: str | tuple, message: str) -> None:
        nonlocal ok
        ok = False
        report(("cluster", *((name,) if isinstance(name, str) else name)), message)

    def string(name: str) -> str | None:
        value = table.get(name)
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            bad(name, f"must be a non-empty string, not {value!r}")
            return None
        return value

    etcd = table.get("etcd")
    endpoints: tuple[str, ...] = ()
    if not isinstance(etcd, list) or not etcd or not all(isinstance(u, str) for u in etcd):
        bad("etcd", 'must list the etcd members, like ["http://127.0.0.1:2379"]')
    else:
        endpoints = tuple(etcd)
    insecure = table.get("insecure", False)
    if not isinstance(insecure, bool):
        bad("insecure", f"must be true or false, not {insecure!r}")
        insecure = False
    for url in endpoints:
        try:
            check_endpoint(url, insecure)
        except EtcdError as e:
            bad("etcd", e.message)

    name = string("name") or hostname()
    if not MACHINE_NAME.match(name):
        bad("name", f"{name!r} is not a machine name (letters, digits, '.', '_', '-'; up to 64)")

    lease_ttl = DEFAULT_LEASE_TTL
    if "lease_ttl" in table:
        try:
            lease_ttl = duration(table["lease_ttl"], where="cluster.lease_ttl")
        except UsageError as e:
            bad("lease_ttl", e.message.removeprefix("cluster.lease_ttl: "))
    if grace is not None and ok:
        problem = timing_problem(lease_ttl, grace)
        if problem:
            bad("lease_ttl", problem)

    prefix = string("prefix") or DEFAULT_PREFIX
    if not _PREFIX.match(prefix):
        bad("prefix", f"{prefix!r} must be like /ccsup: '/'-separated names, no trailing '/'")

    caps: dict[str, int] = {}
    caps_table = table.get("caps", {})
    if not isinstance(caps_table, dict):
        bad("caps", "must be a table of key = cap, like { codex = 2 }")
        caps_table = {}
    for key, value in caps_table.items():
        problem = key_problem(key)
        if problem:
            bad(("caps", key), f"bad cap key: {problem}")
            continue
        try:
            caps[key] = check_cap(key, value)
        except UsageError:
            bad(("caps", key), f"a cap must be a whole number >= 1, not {value!r}")

    user = string("user")
    password = env.get(PASSWORD_ENV) or string("password")
    if password is not None and user is None:
        bad("password", "is given without a user")
    files = {n: string(n) for n in ("ca_file", "cert_file", "key_file")}
    if (files["cert_file"] is None) != (files["key_file"] is None):
        bad("cert_file", "cert_file and key_file go together (a client certificate and its key)")
    if not ok:
        return None
    return ClusterSettings(
        etcd=endpoints,
        name=name,
        lease_ttl=lease_ttl,
        prefix=prefix,
        caps=caps,
        user=user,
        password=password,
        ca_file=files["ca_file"],
        cert_file=files["cert_file"],
        key_file=files["key_file"],
        insecure=insecure,
    )
