"""A small etcd v3 client over etcd's JSON gateway (HTTP/1.1), from the standard library.

What it knows: the gateway's paths and JSON shapes (keys and values base64, 64-bit numbers as
strings), members and failover between them, user/password auth, TLS client certificates, and the
rule that plain http goes only to a loopback address unless `insecure` says otherwise. What it does
not know: ccsup's keys, leases' meaning, fencing (supervisor.cluster) or any event loop.

Design note.
- Why the gateway and not a library: every maintained Python etcd v3 client speaks gRPC, whose
  protobuf pins conflict with other packages and which does not survive fork (the guard zygote
  forks). The gateway is part of every etcd 3.4+ member and needs only http.client.
- Every call is blocking and bounded by a timeout; the supervisor calls it from threads, never on
  its event loop. A call opens its own connection (no shared socket across threads).
- Failover: a call goes to the member that last answered; a member that cannot be reached, times
  out or says it has no leader is skipped and the next is tried; when none answers, the call raises
  EtcdError(unavailable=True). A retried put or txn may have been applied once already: callers use
  only operations for which that is harmless (a put of the same key and value; a delete guarded
  by a compare).
- Errors at this boundary are one type, EtcdError, whose message names the member and the
  operation and says what to do.

State: none stored. A restarted client starts over with the first member; an auth token is fetched
again when etcd says it is invalid or expired.
"""

from __future__ import annotations

import base64
import http.client
import ipaddress
import json
import os
import socket
import ssl
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

from supervisor.errors import CcsupError

PASSWORD_ENV = "CCSUP_ETCD_PASSWORD"

# Gateway answers that mean "this member cannot serve now; another may".
_RETRY_ELSEWHERE = ("no leader", "leader changed", "timed out", "not capable", "unhealthy")
_BAD_TOKEN = ("invalid auth token", "user name is empty")


class EtcdError(CcsupError):
    """An etcd call failed. unavailable: no member could serve it (network, quorum, timeout)."""

    code = "etcd"

    def __init__(self, message: str, *, unavailable: bool = False):
        super().__init__(message)
        self.unavailable = unavailable


@dataclass(frozen=True)
class EtcdSettings:
    endpoints: tuple[str, ...]
    user: str | None = None
    password: str | None = None  # else $CCSUP_ETCD_PASSWORD when user is set
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    insecure: bool = False
    timeout: float = 2.0


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_endpoint(url: str, insecure: bool) -> tuple[str, str, int]:
    """(scheme, host, port) of a member URL; refuses plain http off this machine unless insecure."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise EtcdError(f"etcd endpoint {url!r}: expected http://HOST:PORT or https://HOST:PORT")
    if parsed.path not in ("", "/"):
        raise EtcdError(f"etcd endpoint {url!r}: no path expected after HOST:PORT")
    if parsed.scheme == "http" and not insecure and not is_loopback(parsed.hostname):
        raise EtcdError(
            f"etcd endpoint {url!r}: plain http to another machine sends the lease and the"
            " password in the clear; use https (with ca_file, cert_file, key_file) or set"
            " insecure = true in [cluster]"
        )
    try:
        port = parsed.port or 2379
    except ValueError:
        raise EtcdError(f"etcd endpoint {url!r}: the port is not a number") from None
    return parsed.scheme, parsed.hostname, port


def _b64(data: str | bytes) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.b64encode(raw).decode()


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def prefix_end(prefix: str) -> bytes:
    """The range_end that makes a range cover every key starting with prefix."""
    raw = bytearray(prefix.encode())
    while raw:
        if raw[-1] < 0xFF:
            raw[-1] += 1
            return bytes(raw)
        raw.pop()
    return b"\0"


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int

    @classmethod
    def from_json(cls, kv: dict[str, Any]) -> KeyValue:
        return cls(
            key=_unb64(kv.get("key")).decode("utf-8", "replace"),
            value=_unb64(kv.get("value")),
            create_revision=int(kv.get("create_revision", 0)),
            mod_revision=int(kv.get("mod_revision", 0)),
            version=int(kv.get("version", 0)),
            lease=int(kv.get("lease", 0)),
        )


@dataclass(frozen=True)
class RangeResult:
    kvs: list[KeyValue]
    revision: int  # the store's revision this answer was read at
    count: int
    more: bool


@dataclass(frozen=True)
class TxnResult:
    succeeded: bool
    revision: int
    responses: list[dict[str, Any]]


@dataclass(frozen=True)
class WatchEvent:
    type: Literal["PUT", "DELETE"]
    kv: KeyValue


@dataclass(frozen=True)
class WatchBatch:
    revision: int  # the header revision of this batch: every change up to it was sent
    events: list[WatchEvent]


class Compare(TypedDict, total=False):
    key: str
    result: Literal["EQUAL", "GREATER", "LESS", "NOT_EQUAL"]
    target: Literal["VERSION", "CREATE", "MOD", "VALUE", "LEASE"]
    version: str
    create_revision: str
    mod_revision: str
    value: str
    lease: str


class Op(TypedDict, total=False):
    request_put: dict[str, Any]
    request_delete_range: dict[str, Any]
    request_range: dict[str, Any]


def compare_lease(key: str, lease: int) -> Compare:
    return {"key": _b64(key), "result": "EQUAL", "target": "LEASE", "lease": str(lease)}


def compare_create(key: str, revision: int) -> Compare:
    return {
        "key": _b64(key),
        "result": "EQUAL",
        "target": "CREATE",
        "create_revision": str(revision),
    }


def op_put(key: str, value: bytes, lease: int = 0) -> Op:
    return {"request_put": {"key": _b64(key), "value": _b64(value), "lease": str(lease)}}


def op_get(key: str) -> Op:
    return {"request_range": {"key": _b64(key)}}


def op_delete(key: str) -> Op:
    return {"request_delete_range": {"key": _b64(key)}}


def txn_range_kvs(result: TxnResult, index: int = 0) -> list[KeyValue]:
    """The keys a txn's index-th operation (a request_range) read."""
    response = result.responses[index].get("response_range", {}) if result.responses else {}
    return [KeyValue.from_json(kv) for kv in response.get("kvs", [])]


@dataclass
class MemberStatus:
    endpoint: str
    ok: bool
    leader: bool = False
    revision: int = 0
    error: str | None = None
    version: str | None = None


@dataclass
class _Auth:
    token: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


class EtcdClient:
    """Blocking calls to an etcd cluster's JSON gateway, with failover; see the module docstring."""

    def __init__(self, settings: EtcdSettings):
        if not settings.endpoints:
            raise EtcdError("no etcd endpoint given: list the members in [cluster] etcd")
        self.settings = settings
        self._members = [check_endpoint(url, settings.insecure) for url in settings.endpoints]
        self._current = 0
        self._auth = _Auth()
        self._password = settings.password
        if settings.user and self._password is None:
            self._password = os.environ.get(PASSWORD_ENV)
            if self._password is None:
                raise EtcdError(
                    f"etcd user {settings.user!r} has no password: set ${PASSWORD_ENV}"
                    " or [cluster] auth.password"
                )
        self._ssl: ssl.SSLContext | None = None
        if any(scheme == "https" for scheme, _, _ in self._members):
            try:
                ctx = ssl.create_default_context(cafile=settings.ca_file)
                if settings.cert_file:
                    ctx.load_cert_chain(settings.cert_file, settings.key_file)
            except (OSError, ssl.SSLError) as e:
                raise EtcdError(
                    f"unable to load the etcd TLS files (ca_file {settings.ca_file},"
                    f" cert_file {settings.cert_file}, key_file {settings.key_file}): {e}"
                ) from None
            self._ssl = ctx

    # --- the calls --------------------------------------------------------------------------

    def put(self, key: str, value: bytes, lease: int = 0) -> int:
        """Set key; returns the store's revision after the put."""
        body = {"key": _b64(key), "value": _b64(value), "lease": str(lease)}
        return _revision(self._call("/v3/kv/put", body, "put " + key))

    def get(self, key: str) -> KeyValue | None:
        found = self.range(key)
        return found.kvs[0] if found.kvs else None

    def range(
        self,
        key: str,
        *,
        prefix: bool = False,
        sort_target: Literal["KEY", "CREATE", "MOD", "VERSION", "VALUE"] = "KEY",
        sort_order: Literal["NONE", "ASCEND", "DESCEND"] = "NONE",
        limit: int = 0,
        keys_only: bool = False,
        timeout: float | None = None,
    ) -> RangeResult:
        body: dict[str, Any] = {"key": _b64(key)}
        if prefix:
            body["range_end"] = _b64(prefix_end(key))
        if sort_order != "NONE":
            body["sort_order"], body["sort_target"] = sort_order, sort_target
        if limit:
            body["limit"] = str(limit)
        if keys_only:
            body["keys_only"] = True
        answer = self._call("/v3/kv/range", body, "read " + key, timeout)
        return RangeResult(
            kvs=[KeyValue.from_json(kv) for kv in answer.get("kvs", [])],
            revision=_revision(answer),
            count=int(answer.get("count", 0)),
            more=bool(answer.get("more", False)),
        )

    def delete(self, key: str, *, prefix: bool = False) -> int:
        """Delete key (or every key under prefix); returns how many were deleted."""
        body: dict[str, Any] = {"key": _b64(key)}
        if prefix:
            body["range_end"] = _b64(prefix_end(key))
        return int(self._call("/v3/kv/deleterange", body, "delete " + key).get("deleted", 0))

    def txn(
        self, compare: list[Compare], success: list[Op], failure: list[Op] | None = None
    ) -> TxnResult:
        body = {"compare": list(compare), "success": list(success), "failure": list(failure or [])}
        answer = self._call("/v3/kv/txn", body, "run a transaction")
        return TxnResult(
            succeeded=bool(answer.get("succeeded", False)),
            revision=_revision(answer),
            responses=list(answer.get("responses", [])),
        )

    def lease_grant(self, ttl: int) -> tuple[int, int]:
        """A new lease: (id, ttl in seconds, as etcd granted it)."""
        answer = self._call("/v3/lease/grant", {"TTL": str(ttl)}, f"grant a lease of {ttl}s")
        if answer.get("error"):
            raise EtcdError(f"unable to grant a lease of {ttl}s: {answer['error']}")
        return int(answer["ID"]), int(answer.get("TTL", 0))

    def lease_keepalive(self, lease: int, timeout: float | None = None) -> int:
        """Renew lease once; its TTL in seconds, 0 when etcd no longer knows it (expired, revoked)."""
        answer = self._call(
            "/v3/lease/keepalive", {"ID": str(lease)}, f"renew lease {lease:x}", timeout
        )
        result = answer.get("result", answer)
        # proto3 drops zero fields: a dead lease answers without TTL.
        return int(result.get("TTL", 0))

    def lease_revoke(self, lease: int, timeout: float | None = None) -> None:
        try:
            self._call("/v3/lease/revoke", {"ID": str(lease)}, f"revoke lease {lease:x}", timeout)
        except EtcdError as e:
            if "requested lease not found" not in e.message:
                raise

    def members_status(self, timeout: float = 1.0) -> list[MemberStatus]:
        """Each member's own answer (no failover): for `ccsup status`."""
        found = []
        for i in range(len(self._members)):
            url = self.settings.endpoints[i]
            try:
                answer = self._request(i, "/v3/maintenance/status", {}, timeout)
            except EtcdError as e:
                found.append(MemberStatus(url, ok=False, error=e.message))
                continue
            member = answer.get("header", {}).get("member_id")
            found.append(
                MemberStatus(
                    url,
                    ok=bool(answer.get("leader")) and "error" not in answer,
                    leader=member is not None and answer.get("leader") == member,
                    revision=_revision(answer),
                    version=answer.get("version"),
                )
            )
        return found

    def watch(self, key: str, *, prefix: bool = False, start_revision: int = 0) -> Watch:
        """A stream of changes to key (or under prefix) from start_revision; see Watch."""
        body: dict[str, Any] = {"key": _b64(key)}
        if prefix:
            body["range_end"] = _b64(prefix_end(key))
        if start_revision:
            body["start_revision"] = str(start_revision)
        return Watch(self, {"create_request": body}, key)

    # --- plumbing ---------------------------------------------------------------------------

    def _connect(self, index: int, timeout: float) -> http.client.HTTPConnection:
        scheme, host, port = self._members[index]
        if scheme == "https":
            return http.client.HTTPSConnection(host, port, timeout=timeout, context=self._ssl)
        return http.client.HTTPConnection(host, port, timeout=timeout)

    def _headers(self, index: int, timeout: float) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.settings.user:
            headers["Authorization"] = self._token(index, timeout)
        return headers

    def _token(self, index: int, timeout: float, fresh: bool = False) -> str:
        with self._auth.lock:
            if self._auth.token is None or fresh:
                body = {"name": self.settings.user, "password": self._password}
                answer = self._post(index, "/v3/auth/authenticate", body, {}, timeout)
                token = answer.get("token")
                if not token:
                    raise EtcdError(
                        f"etcd at {self.settings.endpoints[index]} refused user"
                        f" {self.settings.user!r}: {answer.get('error') or answer}"
                    )
                self._auth.token = token
            return self._auth.token

    def _post(
        self, index: int, path: str, body: dict, headers: dict[str, str], timeout: float
    ) -> dict[str, Any]:
        url = self.settings.endpoints[index]
        conn = self._connect(index, timeout)
        try:
            conn.request(
                "POST", path, json.dumps(body), {"Content-Type": "application/json", **headers}
            )
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException) as e:
            raise EtcdError(f"etcd member {url} did not answer: {e}", unavailable=True) from None
        finally:
            conn.close()
        try:
            answer = json.loads(data) if data else {}
        except ValueError:
            raise EtcdError(
                f"etcd member {url} answered {resp.status} with something not JSON: {data[:200]!r}",
                unavailable=True,
            ) from None
        if not isinstance(answer, dict):
            raise EtcdError(f"etcd member {url} answered {answer!r}", unavailable=True)
        message = answer.get("error") or answer.get("message")
        if resp.status != 200 or (message and "result" not in answer):
            text = str(message or data[:200])
            retry = resp.status in (502, 503, 504) or any(s in text for s in _RETRY_ELSEWHERE)
            raise EtcdError(f"etcd member {url} refused {path}: {text}", unavailable=retry)
        err = answer.get("error")
        if isinstance(err, dict):  # a streamed answer's error
            raise EtcdError(f"etcd member {url} refused {path}: {err.get('message')}")
        return answer

    def _request(self, index: int, path: str, body: dict, timeout: float) -> dict[str, Any]:
        try:
            return self._post(index, path, body, self._headers(index, timeout), timeout)
        except EtcdError as e:
            if self.settings.user and any(s in e.message for s in _BAD_TOKEN):
                token = self._token(index, timeout, fresh=True)
                return self._post(index, path, body, {"Authorization": token}, timeout)
            raise

    def _call(
        self, path: str, body: dict, what: str, timeout: float | None = None
    ) -> dict[str, Any]:
        timeout = self.settings.timeout if timeout is None else timeout
        failures = []
        start = self._current
        n = len(self._members)
        for step in range(n):
            index = (start + step) % n
            try:
                answer = self._request(index, path, body, timeout)
            except EtcdError as e:
                if not e.unavailable:
                    raise EtcdError(f"unable to {what}: {e.message}") from None
                failures.append(e.message)
                continue
            self._current = index
            return answer
        raise EtcdError(
            f"unable to {what}: no etcd member answered ({'; '.join(failures)});"
            " check that the members in [cluster] etcd are up and reachable",
            unavailable=True,
        )


class Watch:
    """A watch's stream of batches. Iterate it from one thread; close() from any thread ends it.

    The first member that accepts the watch serves it; when its stream breaks, iteration raises
    EtcdError(unavailable=True) and the caller opens a new watch from the last revision it saw.
    """

    def __init__(self, client: EtcdClient, body: dict, key: str):
        self._client, self._body, self._key = client, body, key
        self._conn: http.client.HTTPConnection | None = None
        self._sock: socket.socket | None = None
        self._closed = False
        self._lock = threading.Lock()

    def _open(self) -> http.client.HTTPResponse:
        client = self._client
        failures = []
        n = len(client._members)
        for step in range(n):
            index = (client._current + step) % n
            url = client.settings.endpoints[index]
            conn = client._connect(index, client.settings.timeout)
            try:
                headers = client._headers(index, client.settings.timeout)
                conn.request("POST", "/v3/watch", json.dumps(self._body), headers)
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException, EtcdError) as e:
                conn.close()
                failures.append(f"{url}: {e}")
                continue
            if resp.status != 200:
                failures.append(f"{url}: HTTP {resp.status}: {resp.read()[:200]!r}")
                conn.close()
                continue
            with self._lock:
                if self._closed:
                    conn.close()
                    raise EtcdError("the watch was closed", unavailable=True)
                self._conn = conn
                self._sock = conn.sock
            if self._sock is not None:
                self._sock.settimeout(None)  # a watch is quiet for as long as nothing changes
            return resp
        raise EtcdError(
            f"unable to watch {self._key}: no etcd member answered ({'; '.join(failures)})",
            unavailable=True,
        )

    def __iter__(self) -> Iterator[WatchBatch]:
        resp = self._open()
        created = False
        while True:
            try:
                line = resp.readline()
            except (OSError, http.client.HTTPException, ValueError) as e:
                raise EtcdError(f"the watch of {self._key} broke: {e}", unavailable=True) from None
            if not line:
                raise EtcdError(f"the watch of {self._key} ended", unavailable=True)
            try:
                message = json.loads(line)
            except ValueError:
                raise EtcdError(
                    f"the watch of {self._key} sent something not JSON: {line[:200]!r}",
                    unavailable=True,
                ) from None
            if "error" in message:
                err = message["error"]
                text = err.get("message") if isinstance(err, dict) else err
                raise EtcdError(f"the watch of {self._key} failed: {text}", unavailable=True)
            result = message.get("result", {})
            if result.get("canceled") or int(result.get("compact_revision", 0) or 0):
                raise EtcdError(
                    f"the watch of {self._key} was cancelled by etcd"
                    f" (compacted at {result.get('compact_revision')}): read again",
                )
            if result.get("created") and not created:
                created = True
                yield WatchBatch(_revision(result), [])
                if not result.get("events"):
                    continue
            events = [
                WatchEvent(
                    "DELETE" if e.get("type") == "DELETE" else "PUT", KeyValue.from_json(e["kv"])
                )
                for e in result.get("events", [])
            ]
            yield WatchBatch(_revision(result), events)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed


def _revision(answer: dict[str, Any]) -> int:
    return int(answer.get("header", {}).get("revision", 0))
