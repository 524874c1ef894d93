"""`[cluster]`: caps across machines, kept in etcd v3 (supervisor.cluster.gate;
docs/cluster.md). Without this table nothing changes.

The section's schema, its value (`ClusterSettings`) and its checks (`parse_cluster_table`, pure
and table-tested) live here; each problem is reported through the Checker.

What `[cluster]` says, as one value: the etcd members, this machine's name, the lease, the key
prefix and the cluster caps. Pure: no I/O (supervisor.cluster.gate does the talking).

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

from .schema import Checker, Key, Report, Section, Table, per_key

if (
    TYPE_CHECKING
):  # supervisor.cluster.etcd (http.client, ssl) costs ~20 ms: loaded only with [cluster]
    from ..cluster.transport import EtcdSettings

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
        from ..cluster.transport import EtcdSettings

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


def parse_cluster_table(
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
    from ..caps import check_cap, key_problem  # the one place that says what a key and a cap are
    from ..cluster.transport import PASSWORD_ENV, EtcdError, check_endpoint
    from ..errors import UsageError
    from .values import duration  # imported here: supervisor.config imports this module

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
    for key, _, value in per_key(
        lambda path, message: bad(path[1:], message),
        table,
        ("cluster", "caps"),
        holds="key = cap, like { codex = 2 }",
        check_key=key_problem,
    ):
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


if TYPE_CHECKING:
    from .cluster import ClusterSettings

SECTION = Section(
    ("cluster",),
    "Caps across machines, kept in etcd v3 (docs/cluster.md). Without this table\n"
    "every cap is this machine's alone.",
    (
        Key(
            "etcd",
            ["https://etcd1:2379", "https://etcd2:2379", "https://etcd3:2379"],
            "The etcd members; a call goes on to the next when one does not answer. Plain http\n"
            "only to this machine (127.0.0.1, ::1, localhost) unless insecure = true.",
            example=True,
        ),
        Key(
            "name",
            "laptop",
            "This machine in the cluster, unique among them (default: the host name).",
            example=True,
        ),
        Key(
            "lease_ttl",
            "10s",
            "This supervisor's lease in etcd. Its turns of cluster keys are stopped before the\n"
            "lease could expire unrenewed, so it must exceed 1.5 x ([guard] grace + 0.5s).",
            example=True,
        ),
        Key("prefix", "/ccsup", "Every key ccsup writes in etcd is under it.", example=True),
        Key(
            "caps",
            {"codex": 2},
            "The keys capped across every machine (a bare harness caps each of its keys on its\n"
            "own). A turn of one needs a cluster slot and a local slot; other keys stay local.",
            example=True,
        ),
        Key(
            "user",
            "ccsup",
            "etcd authentication: the user; its password from $CCSUP_ETCD_PASSWORD.",
            example=True,
        ),
        Key(
            "password",
            "<the etcd password>",
            "The password, if it must be in this file ($CCSUP_ETCD_PASSWORD wins).",
            example=True,
        ),
        Key("ca_file", "/etc/ccsup/etcd-ca.pem", "TLS: the CA of the members.", example=True),
        Key("cert_file", "/etc/ccsup/etcd-client.pem", "TLS: a client certificate.", example=True),
        Key("key_file", "/etc/ccsup/etcd-client-key.pem", "TLS: its key.", example=True),
        Key(
            "insecure",
            False,
            "Allow plain http to a member on another machine (the lease and the password then\n"
            "travel in the clear).",
            example=True,
        ),
    ),
    example=True,
)


def parse_cluster(
    c: Checker, top: Table, grace: float | None, env: Mapping[str, str]
) -> ClusterSettings | None:
    if "cluster" not in top:
        return None
    table = c.table(top, ("cluster",))
    if not isinstance(top["cluster"], dict):
        return None  # c.table reported it
    return parse_cluster_table(table, c.add, grace=grace, env=env)
