"""The etcd client (supervisor.cluster.etcd) against a real 3-member etcd cluster, and the test harness."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
import urllib.request
import uuid

import pytest
from etcd_cluster import etcd_binary, free_ports

from supervisor.cluster.etcd import EtcdClient, compare_lease, op_delete, op_put
from supervisor.cluster.transport import EtcdError, EtcdSettings

pytestmark = pytest.mark.timeout(60)


def client_for(endpoints, **kw) -> EtcdClient:
    return EtcdClient(EtcdSettings(endpoints=tuple(endpoints), **kw))


@pytest.fixture
def ns():
    """A key prefix of this test's own in the shared cluster."""
    return f"/t-{uuid.uuid4().hex[:8]}/"


def test_the_harness_starts_three_healthy_members_with_one_leader(etcd_shared):
    assert len(etcd_shared.members) == 3
    assert all(m.healthy() for m in etcd_shared.members)
    leaders = [
        m for m in etcd_shared.members if m.status()["leader"] == m.status()["header"]["member_id"]
    ]
    assert len(leaders) == 1
    statuses = client_for(etcd_shared.endpoints).members_status()
    assert [s.ok for s in statuses] == [True, True, True]
    assert sum(s.leader for s in statuses) == 1


def test_put_and_range_sorted_by_create_revision_with_a_limit(etcd_shared, ns):
    c = client_for(etcd_shared.endpoints)
    # Created in the order c, a, b: sorted by create revision, not by name.
    revs = [c.put(ns + name, name.encode()) for name in ("c", "a", "b")]
    assert revs == sorted(revs)
    c.put(ns + "c", b"again")  # a new value keeps its create revision
    found = c.range(ns, prefix=True, sort_target="CREATE", sort_order="ASCEND", limit=2)
    assert [kv.key for kv in found.kvs] == [ns + "c", ns + "a"]
    assert [kv.create_revision for kv in found.kvs] == revs[:2]
    assert found.kvs[0].value == b"again" and found.kvs[0].version == 2
    assert found.count == 3 and found.more is True
    assert found.revision >= revs[-1] + 1
    keys_only = c.range(ns, prefix=True, keys_only=True)
    assert [kv.value for kv in keys_only.kvs] == [b"", b"", b""]
    assert c.delete(ns, prefix=True) == 3
    assert c.range(ns, prefix=True).kvs == []


def test_txn_deletes_only_while_the_key_is_under_our_lease(etcd_shared, ns):
    c = client_for(etcd_shared.endpoints)
    ours, _ = c.lease_grant(30)
    theirs, _ = c.lease_grant(30)
    c.put(ns + "k", b"v", lease=theirs)
    result = c.txn([compare_lease(ns + "k", ours)], [op_delete(ns + "k")])
    assert result.succeeded is False
    assert c.get(ns + "k") is not None
    c.txn([], [op_put(ns + "k", b"w", lease=ours)])
    result = c.txn([compare_lease(ns + "k", ours)], [op_delete(ns + "k")])
    assert result.succeeded is True
    assert c.get(ns + "k") is None
    c.lease_revoke(ours)
    c.lease_revoke(theirs)


def test_a_lease_is_renewed_then_revoked_and_its_keys_go_with_it(etcd_shared, ns):
    c = client_for(etcd_shared.endpoints)
    lease, ttl = c.lease_grant(5)
    assert ttl == 5
    c.put(ns + "q", b"", lease=lease)
    assert c.get(ns + "q").lease == lease
    assert c.lease_keepalive(lease) == 5
    c.lease_revoke(lease)
    assert c.get(ns + "q") is None
    assert c.lease_keepalive(lease) == 0  # a dead lease answers without a TTL
    c.lease_revoke(lease)  # revoking again is no error


def test_a_watch_from_a_revision_streams_every_change_after_it(etcd_shared, ns):
    c = client_for(etcd_shared.endpoints)
    first = c.put(ns + "a", b"1")
    c.put(ns + "b", b"2")
    c.delete(ns + "a")
    watch = c.watch(ns, prefix=True, start_revision=first + 1)
    seen: list[tuple[str, str, int]] = []
    done = threading.Event()

    def follow():
        try:
            for batch in watch:
                for e in batch.events:
                    seen.append((e.type, e.kv.key, e.kv.mod_revision))
                if len(seen) >= 3:
                    done.set()
                    return
        except EtcdError:
            done.set()

    t = threading.Thread(target=follow)
    t.start()
    later = c.put(ns + "c", b"3")  # after the watch began: streamed
    assert done.wait(10)
    watch.close()
    t.join(5)
    assert seen == [
        ("PUT", ns + "b", first + 1),
        ("DELETE", ns + "a", first + 2),
        ("PUT", ns + "c", later),
    ]


def test_close_ends_a_quiet_watch_at_once(etcd_shared, ns):
    c = client_for(etcd_shared.endpoints)
    watch = c.watch(ns, prefix=True)
    ended = threading.Event()
    batches = []

    def follow():
        try:
            for batch in watch:
                batches.append(batch)
        except EtcdError:
            ended.set()

    t = threading.Thread(target=follow)
    t.start()
    time.sleep(0.2)  # let it block in its read (nothing changes under ns)
    watch.close()
    assert ended.wait(5)
    t.join(5)
    assert len(batches) == 1 and batches[0].events == []  # only the "created" answer


def test_a_call_fails_over_to_the_next_member(etcd_shared, ns):
    dead = f"http://127.0.0.1:{free_ports(1)[0]}"
    c = client_for([dead, *etcd_shared.endpoints])
    c.put(ns + "x", b"1")
    assert c.get(ns + "x").value == b"1"


def test_no_member_answering_is_one_error_naming_every_member(ns):
    dead = [f"http://127.0.0.1:{p}" for p in free_ports(2)]
    c = client_for(dead, timeout=0.5)
    with pytest.raises(EtcdError) as e:
        c.put(ns + "x", b"1")
    assert e.value.unavailable is True
    assert dead[0] in e.value.message and dead[1] in e.value.message
    assert e.value.message.startswith(f"unable to put {ns}x: no etcd member answered")


@pytest.mark.parametrize(
    "url, insecure, refused",
    [
        ("http://127.0.0.1:2379", False, False),
        ("http://localhost:2379", False, False),
        ("http://[::1]:2379", False, False),
        ("http://10.1.2.3:2379", False, True),
        ("http://etcd.example:2379", False, True),
        ("http://10.1.2.3:2379", True, False),
        ("https://10.1.2.3:2379", False, False),
        ("ftp://127.0.0.1:2379", True, True),
    ],
)
def test_plain_http_to_another_machine_is_refused_unless_insecure(url, insecure, refused):
    if refused:
        with pytest.raises(EtcdError):
            client_for([url], insecure=insecure)
    else:
        client_for([url], insecure=insecure)


def test_a_partition_made_by_the_relay_times_out_then_heals(etcd_shared, relay, ns):
    r = relay(("127.0.0.1", etcd_shared.members[0].client_port))
    c = client_for([r.url], timeout=0.5)
    c.put(ns + "p", b"1")
    r.block()
    started = time.monotonic()
    with pytest.raises(EtcdError) as e:
        c.get(ns + "p")
    assert e.value.unavailable is True
    assert time.monotonic() - started < 2.0
    r.unblock()
    assert c.get(ns + "p").value == b"1"


def _post(url, path, body, token=None):
    headers = {"Authorization": token} if token else {}
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers=headers)
    with urllib.request.urlopen(req, timeout=2) as resp:
        return json.loads(resp.read())


def test_auth_with_a_password_from_the_environment(etcd_cluster, monkeypatch):
    url = etcd_cluster.endpoints[0]
    _post(url, "/v3/auth/user/add", {"name": "root", "password": "s3cret"})
    _post(url, "/v3/auth/user/grant", {"user": "root", "role": "root"})
    _post(url, "/v3/auth/enable", {})
    anonymous = client_for(etcd_cluster.endpoints)
    with pytest.raises(EtcdError) as e:
        anonymous.put("/a", b"1")
    assert e.value.unavailable is False
    with pytest.raises(EtcdError, match="CCSUP_ETCD_PASSWORD"):
        client_for(etcd_cluster.endpoints, user="root")
    monkeypatch.setenv("CCSUP_ETCD_PASSWORD", "s3cret")
    c = client_for(etcd_cluster.endpoints, user="root")
    c.put("/a", b"1")
    assert c.get("/a").value == b"1"
    wrong = client_for(etcd_cluster.endpoints, user="root", password="nope")
    with pytest.raises(EtcdError, match="refused"):
        wrong.put("/a", b"2")


def _openssl(*args: str, cwd) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _certificates(d) -> None:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, with EC keys. The CA
    has a key usage: Python 3.13's default context (VERIFY_X509_STRICT) refuses one without."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
             "-subj", "/CN=ccsup-test-ca", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             cwd=d)  # fmt: skip
    for name, ext in (
        # etcd's gateway dials its own gRPC with the server certificate: clientAuth too.
        ("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth"),
        ("client", "extendedKeyUsage=clientAuth"),
    ):
        (d / f"{name}.ext").write_text(ext + "\n")
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj",
                 f"/CN={name}", cwd=d)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{name}.pem", "-days", "1", "-extfile",
                 f"{name}.ext", cwd=d)  # fmt: skip


def test_tls_with_a_client_certificate(tmp_path):
    binary = etcd_binary()
    if binary is None or shutil.which("openssl") is None:
        pytest.skip("needs the etcd binary and openssl")
    _certificates(tmp_path)
    client_port, peer_port = free_ports(2)
    url = f"https://127.0.0.1:{client_port}"
    env = {k: v for k, v in os.environ.items() if k != "CCSUP_TEST_RUN"}
    args = [
        binary,
        f"--data-dir={tmp_path / 'data'}",
        f"--listen-client-urls={url}",
        f"--advertise-client-urls={url}",
        f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
        f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
        f"--initial-cluster=default=http://127.0.0.1:{peer_port}",
        f"--cert-file={tmp_path / 'server.pem'}",
        f"--key-file={tmp_path / 'server.key'}",
        f"--trusted-ca-file={tmp_path / 'ca.pem'}",
        "--client-cert-auth",
        "--log-level=error",
        "--logger=zap",
    ]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        c = client_for(
            [url],
            ca_file=str(tmp_path / "ca.pem"),
            cert_file=str(tmp_path / "client.pem"),
            key_file=str(tmp_path / "client.key"),
            timeout=1.0,
        )
        deadline = time.monotonic() + 15
        while True:
            try:
                c.put("/tls", b"1")
                break
            except EtcdError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.05)
        assert c.get("/tls").value == b"1"
        no_cert = client_for([url], ca_file=str(tmp_path / "ca.pem"), timeout=1.0)
        with pytest.raises(EtcdError):
            no_cert.get("/tls")
        with pytest.raises(EtcdError, match="unable to load the etcd TLS files"):
            client_for([url], ca_file=str(tmp_path / "missing.pem"))
    finally:
        proc.kill()
        proc.wait(10)
