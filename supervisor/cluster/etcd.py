"""A small etcd v3 client over etcd's JSON gateway (HTTP/1.1): the KV, lease and watch calls.

What it knows: the gateway's paths and JSON shapes (keys and values base64, 64-bit numbers as
strings), the results (KeyValue, RangeResult, TxnResult, WatchBatch), the txn compare and op
builders, and the watch's stream of batches. What it does not know: members, failover, TLS or
auth (supervisor.cluster.transport, which carries every call), ccsup's keys, leases' meaning,
fencing (supervisor.cluster.gate) or any event loop.

Design note. Why the gateway and not a library: every maintained Python etcd v3 client speaks
gRPC, whose protobuf pins conflict with other packages and which does not survive fork (the guard
zygote forks). The gateway is part of every etcd 3.4+ member and needs only http.client. Every
call is blocking and bounded by a timeout (see supervisor.cluster.transport for failover, and which
calls may be retried).

State: none stored.
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

from .transport import EtcdError, EtcdSettings, EtcdTransport


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


class EtcdClient:
    """Blocking calls to an etcd cluster's JSON gateway, with failover; see the module docstring."""

    def __init__(self, settings: EtcdSettings):
        self.settings = settings
        self._transport = EtcdTransport(settings)
        self._call = self._transport.call

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
        for i in range(len(self.settings.endpoints)):
            url = self.settings.endpoints[i]
            try:
                answer = self._transport.request(i, "/v3/maintenance/status", {}, timeout)
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
        return Watch(self._transport, {"create_request": body}, key)


class Watch:
    """A watch's stream of batches. Iterate it from one thread; close() from any thread ends it.

    The first member that accepts the watch serves it; when its stream breaks, iteration raises
    EtcdError(unavailable=True) and the caller opens a new watch from the last revision it saw.
    """

    def __init__(self, transport: EtcdTransport, body: dict, key: str):
        self._transport, self._body, self._key = transport, body, key
        self._conn: http.client.HTTPConnection | None = None
        self._sock: socket.socket | None = None
        self._closed = False
        self._lock = threading.Lock()

    def _open(self) -> http.client.HTTPResponse:
        conn, resp = self._transport.open_stream("/v3/watch", self._body, f"watch {self._key}")
        with self._lock:
            if self._closed:
                conn.close()
                raise EtcdError("the watch was closed", unavailable=True)
            self._conn = conn
            self._sock = conn.sock
        if self._sock is not None:
            self._sock.settimeout(None)  # a watch is quiet for as long as nothing changes
        return resp

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
