"""How ccsup reaches etcd: members, failover between them, TLS, user/password auth, one POST.

What it knows: the member URLs and the rule that plain http goes only to a loopback address
unless `insecure` says otherwise (`check_endpoint`), TLS client certificates, the auth token and
when to fetch it again, which answers mean "try another member", and how a call fails over from
the member that last answered to the next. What it does not know: the gateway's KV, lease and watch
calls or their JSON shapes (supervisor.cluster.etcd), ccsup's keys, or any event loop.

Design note.
- Every call is blocking and bounded by a timeout; the supervisor calls it from threads, never on
  its event loop. A call opens its own connection (no shared socket across threads).
- Failover: a call goes to the member that last answered; a member that cannot be reached, times
  out or says it has no leader is skipped and the next is tried; when none answers, the call raises
  EtcdError(unavailable=True). A retried put or txn may have been applied once already: callers use
  only operations for which that is harmless (a put of the same key and value; a delete guarded
  by a compare).
- Errors at this boundary are one type, EtcdError, whose message names the member and the
  operation and says what to do.

State: none stored. A restarted transport starts over with the first member; an auth token is
fetched again when etcd says it is invalid or expired.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import os
import ssl
import threading
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from ..errors import CcsupError

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


@dataclass
class _Auth:
    token: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


class EtcdTransport:
    """POSTs to a cluster's members with failover and auth; see the module docstring."""

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

    @property
    def endpoints(self) -> tuple[str, ...]:
        return self.settings.endpoints

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

    def request(self, index: int, path: str, body: dict, timeout: float) -> dict[str, Any]:
        try:
            return self._post(index, path, body, self._headers(index, timeout), timeout)
        except EtcdError as e:
            if self.settings.user and any(s in e.message for s in _BAD_TOKEN):
                token = self._token(index, timeout, fresh=True)
                return self._post(index, path, body, {"Authorization": token}, timeout)
            raise

    def call(
        self, path: str, body: dict, what: str, timeout: float | None = None
    ) -> dict[str, Any]:
        timeout = self.settings.timeout if timeout is None else timeout
        failures = []
        start = self._current
        n = len(self._members)
        for step in range(n):
            index = (start + step) % n
            try:
                answer = self.request(index, path, body, timeout)
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

    def open_stream(
        self, path: str, body: dict, what: str
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """A streamed POST (a watch): the first member that accepts it, from the last that
        answered; the caller reads the response and closes the connection."""
        failures = []
        n = len(self._members)
        for step in range(n):
            index = (self._current + step) % n
            url = self.settings.endpoints[index]
            conn = self._connect(index, self.settings.timeout)
            try:
                headers = self._headers(index, self.settings.timeout)
                conn.request("POST", path, json.dumps(body), headers)
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException, EtcdError) as e:
                conn.close()
                failures.append(f"{url}: {e}")
                continue
            if resp.status != 200:
                failures.append(f"{url}: HTTP {resp.status}: {resp.read()[:200]!r}")
                conn.close()
                continue
            return conn, resp
        raise EtcdError(
            f"unable to {what}: no etcd member answered ({'; '.join(failures)})",
            unavailable=True,
        )
