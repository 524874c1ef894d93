"""Who may use the page: the Host check, the token (bearer or login cookie), cross-site checks.

The rules, in order, for every request:
0. Owner. Without `[web] token` (so on loopback only), the connection's client socket must be
   this server's own uid's, read from the kernel's socket table (supervisor.web.peer): every
   local user reaches loopback, and the page is its owner's alone, as the state directory and
   its sockets are. Another uid gets 403, and so does a peer that cannot be named. With a token
   set, the token is the rule and any uid holding it may use the page.
1. Host. The Host header must name this server: on a loopback listen, `localhost`, `127.0.0.1`,
   `[::1]` or the listen address with the bound port (a page on another site that rebinds its
   name to 127.0.0.1 sends its own name as Host and is refused); on a wildcard listen any Host.
2. Token. With `[web] token` set (required off loopback), a request carries it as
   `Authorization: Bearer <token>` or the session cookie that `/login` set, either from the
   one-time code `ccsup web` prints or from the login form (the token, POSTed). Else 401.
3. Changes (any method but GET/HEAD). A browser request (no bearer token) must come from this
   origin: `Origin` equal to `http://<Host>` (or https), and an `X-Ccsup-Csrf` header equal to
   the token embedded in the page (the login form's POST carries the [web] token instead) (a custom header makes a cross-site request need a CORS preflight, which
   this server never grants). A bearer-token request is a script's: browsers cannot add it
   cross-site. The session cookie is also SameSite=Strict and HttpOnly.

Knows HTTP headers, secrets and (through supervisor.web.peer) who owns a loopback connection;
nothing of the supervisor.
"""

from __future__ import annotations

import hmac
import os
import secrets
from typing import NamedTuple

from ..config.web import Listen, is_loopback
from .peer import peer_uid

COOKIE = "ccsup_web"
CSRF_HEADER = "X-Ccsup-Csrf"
SAFE_METHODS = ("GET", "HEAD")


class Verdict(NamedTuple):
    status: int  # 0: allowed
    reason: str


ALLOWED = Verdict(0, "")


class Gate:
    """The checks of one running server; `sessions` are the cookies it has handed out."""

    def __init__(self, listen: Listen, port: int, token: str | None):
        self.listen = listen
        self.port = port
        self.token = token
        self.csrf = secrets.token_urlsafe(24)
        self.sessions: set[str] = set()
        self.login_code: str | None = secrets.token_urlsafe(24) if token else None
        self.hosts = self._hosts()

    def _hosts(self) -> set[str] | None:
        """The Host headers accepted; None: any (a wildcard listen)."""
        host = self.listen.host
        if host in ("0.0.0.0", "::"):
            return None
        names = {self.listen.url_host()}
        if is_loopback(host):
            names |= {"localhost", "127.0.0.1", "[::1]"}
        return {f"{name}:{self.port}" for name in names} | (names if self.port == 80 else set())

    def check_peer(self, local: tuple | None, peer: tuple | None) -> Verdict:
        """Without a token, only this server's uid may connect (rule 0)."""
        if self.token is not None:
            return ALLOWED
        owner = os.geteuid()
        uid = peer_uid(local, peer) if local and peer else None
        if uid == owner:
            return ALLOWED
        who = "an unknown user" if uid is None else f"uid {uid}"
        return Verdict(
            403,
            f"this page is uid {owner}'s alone and this connection is {who}'s; "
            "set [web] token to share it",
        )

    def check_host(self, host: str | None) -> Verdict:
        if self.hosts is None or (host is not None and host.lower() in self.hosts):
            return ALLOWED
        return Verdict(403, f"this server does not answer for Host {host!r}")

    def bearer_ok(self, authorization: str | None) -> bool:
        if not self.token or not authorization or not authorization.startswith("Bearer "):
            return False
        return hmac.compare_digest(authorization[7:].strip().encode(), self.token.encode())

    def session_ok(self, cookie: str | None) -> bool:
        if not cookie:
            return False
        return any(hmac.compare_digest(cookie.encode(), s.encode()) for s in self.sessions)

    def check_auth(self, authorization: str | None, cookie: str | None) -> Verdict:
        if self.token is None or self.bearer_ok(authorization) or self.session_ok(cookie):
            return ALLOWED
        return Verdict(401, "this page needs the [web] token: a bearer token or a login")

    def check_change(
        self,
        method: str,
        host: str | None,
        origin: str | None,
        csrf: str | None,
        authorization: str | None,
        *,
        login: bool = False,
    ) -> Verdict:
        """`login`: the login form's POST, which carries the token itself instead of the header."""
        if method in SAFE_METHODS or self.bearer_ok(authorization):
            return ALLOWED
        # https: the same page behind a TLS proxy that keeps the Host.
        if host is None or origin not in (f"http://{host}", f"https://{host}"):
            return Verdict(403, f"a change must come from this page's origin, not {origin!r}")
        if login:
            return ALLOWED
        if csrf is None or not hmac.compare_digest(csrf.encode(), self.csrf.encode()):
            return Verdict(403, f"a change must carry this page's {CSRF_HEADER} header")
        return ALLOWED

    def use_login_code(self, code: str) -> str | None:
        """A new session for the one-time code (then spent), else None."""
        if self.login_code is None or not hmac.compare_digest(
            code.encode(), self.login_code.encode()
        ):
            return None
        self.login_code = None
        return self.new_session()

    def login_with_token(self, token: str) -> str | None:
        if self.token is None or not hmac.compare_digest(token.encode(), self.token.encode()):
            return None
        return self.new_session()

    def new_session(self) -> str:
        session = secrets.token_urlsafe(32)
        self.sessions.add(session)
        return session
