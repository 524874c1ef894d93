"""What `[cluster]` says, as one value: the etcd members, this machine's name, the lease, the key
prefix and the cluster caps. Pure: no I/O (supervisor.cluster does the talking).

A key is a cluster key when it is named in `caps`, or when it is `harness:variant` and its bare
harness is named there (each such key capped on its own, as in `[slots]`); every other key stays
machine-local.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from .etcd import EtcdSettings

DEFAULT_LEASE_TTL = 10.0
DEFAULT_PREFIX = "/ccsup"
MACHINE_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}\Z")
# The guard starts its stop this long before grace + margin end at the lease deadline; covers the
# guard's own wake-up and kill latency and the machines' clock rates drifting apart over a TTL.
FENCE_MARGIN = 0.5


def default_name() -> str:
    return socket.gethostname().split(".")[0] or "localhost"


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
