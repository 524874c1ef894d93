"""`[cluster]`: caps across machines, kept in etcd v3 (supervisor.cluster; README "Several
machines"). Without this table nothing changes.

The section's schema lives here; its values and their checks are supervisor.cluster_settings'
(`parse_cluster`, pure and table-tested there), which reports each problem through the Checker.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from .schema import Checker, Key, Section, Table

if TYPE_CHECKING:
    from ..cluster_settings import ClusterSettings

SECTION = Section(
    ("cluster",),
    "Caps across machines, kept in etcd v3 (README: Several machines). Without this table\n"
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
    # Imported here: a config without [cluster] (most, and every `ccsup` command reads one) does
    # not compile its checks.
    from ..cluster_settings import parse_cluster as parse_values

    return parse_values(table, c.add, grace=grace, env=env)
