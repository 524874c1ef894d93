"""`[cluster]` parsing (supervisor.config.cluster.parse_cluster_table): pure, table-driven."""

from __future__ import annotations

import pytest

from supervisor.config.cluster import ClusterSettings
from supervisor.config.cluster import parse_cluster_table as parse_cluster

ETCD = ["http://127.0.0.1:2379"]


def parse(table, grace=5.0, env=None):
    problems: list[tuple[tuple, str]] = []
    settings = parse_cluster(
        table,
        lambda path, message: problems.append((path, message)),
        grace=grace,
        env=env or {},
        hostname=lambda: "box",
    )
    return settings, problems


def test_defaults():
    settings, problems = parse({"etcd": ETCD, "caps": {"codex": 2, "opencode": 3}})
    assert problems == []
    assert settings == ClusterSettings(
        etcd=tuple(ETCD),
        name="box",
        lease_ttl=10.0,
        prefix="/ccsup",
        caps={"codex": 2, "opencode": 3},
    )
    assert settings.is_cluster_key("codex") and settings.is_cluster_key("opencode:xai")
    assert settings.is_cluster_key("codex:x") and not settings.is_cluster_key("claude")


def test_every_key():
    settings, problems = parse(
        {
            "etcd": ["https://10.0.0.1:2379", "https://10.0.0.2:2379"],
            "name": "laptop",
            "lease_ttl": "20s",
            "prefix": "/team/ccsup",
            "caps": {"codex": 2},
            "user": "ccsup",
            "ca_file": "/etc/ca.pem",
            "cert_file": "/etc/c.pem",
            "key_file": "/etc/k.pem",
        },
        env={"CCSUP_ETCD_PASSWORD": "pw"},
    )
    assert problems == []
    assert (settings.name, settings.lease_ttl, settings.prefix) == ("laptop", 20.0, "/team/ccsup")
    assert (settings.user, settings.password) == ("ccsup", "pw")
    assert (settings.ca_file, settings.cert_file, settings.key_file) == (
        "/etc/ca.pem",
        "/etc/c.pem",
        "/etc/k.pem",
    )


@pytest.mark.parametrize(
    "table, key, words",
    [
        ({}, ("cluster", "etcd"), "must list the etcd members"),
        ({"etcd": []}, ("cluster", "etcd"), "must list"),
        ({"etcd": "http://127.0.0.1:2379"}, ("cluster", "etcd"), "must list"),
        ({"etcd": ["http://10.0.0.1:2379"]}, ("cluster", "etcd"), "insecure = true"),
        ({"etcd": ["127.0.0.1:2379"]}, ("cluster", "etcd"), "expected http://HOST:PORT"),
        ({"etcd": ETCD, "insecure": "yes"}, ("cluster", "insecure"), "true or false"),
        ({"etcd": ETCD, "name": "a/b"}, ("cluster", "name"), "not a machine name"),
        ({"etcd": ETCD, "lease_ttl": "soon"}, ("cluster", "lease_ttl"), "not a duration"),
        ({"etcd": ETCD, "lease_ttl": "6s"}, ("cluster", "lease_ttl"), "at least 8.25s"),
        ({"etcd": ETCD, "prefix": "ccsup"}, ("cluster", "prefix"), "must be like /ccsup"),
        ({"etcd": ETCD, "prefix": "/ccsup/"}, ("cluster", "prefix"), "no trailing"),
        ({"etcd": ETCD, "caps": {"codex": 0}}, ("cluster", "caps", "codex"), "whole number >= 1"),
        ({"etcd": ETCD, "caps": {"_x": 1}}, ("cluster", "caps", "_x"), "reserved"),
        ({"etcd": ETCD, "caps": 3}, ("cluster", "caps"), "table of key = cap"),
        ({"etcd": ETCD, "password": "pw"}, ("cluster", "password"), "without a user"),
        ({"etcd": ETCD, "cert_file": "/c"}, ("cluster", "cert_file"), "go together"),
        ({"etcd": ETCD, "user": ""}, ("cluster", "user"), "non-empty string"),
    ],
)
def test_each_problem_names_its_key(table, key, words):
    settings, problems = parse(table)
    assert settings is None
    assert [path for path, _ in problems] == [key]
    assert words in problems[0][1]


def test_a_short_ttl_is_fine_with_a_short_grace():
    settings, problems = parse({"etcd": ETCD, "lease_ttl": "2s"}, grace=0.3)
    assert problems == [] and settings.lease_ttl == 2.0
    assert settings.renew_interval(0.3) == pytest.approx(0.6)


def test_the_config_file_carries_cluster_and_names_the_line_of_a_problem():
    from supervisor import config

    assert config.parse("", "x.toml").cluster is None  # without [cluster] nothing changes
    text = '[guard]\ngrace = "300ms"\n[cluster]\netcd = ["http://127.0.0.1:2379"]\nname = "a"\n'
    parsed = config.parse(text + 'lease_ttl = "2s"\ncaps = { codex = 2 }\n', "x.toml")
    assert parsed.cluster == ClusterSettings(
        etcd=("http://127.0.0.1:2379",), name="a", lease_ttl=2.0, caps={"codex": 2}
    )
    with pytest.raises(config.ConfigProblems) as e:
        config.parse(text + "lease = 3\n", "x.toml")
    assert str(e.value) == "x.toml:6: cluster.lease: unknown key (did you mean lease_ttl?)"
    with pytest.raises(config.ConfigProblems) as e:
        config.parse('[cluster]\netcd = ["http://127.0.0.1:2379"]\nlease_ttl = "4s"\n', "x.toml")
    assert str(e.value).startswith("x.toml:3: cluster.lease_ttl: a lease_ttl of 4s leaves too")
