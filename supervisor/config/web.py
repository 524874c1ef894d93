"""`[web]`: the live page (`ccsup web`): where it listens beside the supervisor, and its token.

The checks themselves (what a listen address is, when a token is needed) live with the page, in
supervisor.config.web; this module places them in the file, with their keys and lines.

`[web]` and `ccsup web --listen`: where the page listens and the token that guards it.

Pure: the checks read only their arguments (no socket is bound, no name is resolved). A listen
address is `HOST:PORT` (`[::1]:8765` for IPv6); HOST is an IP literal or `localhost`, so whether
it is loopback is decided here and not by a resolver that could answer otherwise later.

The rule: a loopback listen may run without a token, and then the page answers only its owner's
uid (every local user reaches loopback; supervisor.web.peer names the uid of each connection's
client socket, another gets 403); any other address needs `[web] token` (the page can cancel
turns, so the open network gets nothing without it). A token, once set, is required on every
listen, loopback included, and it is then the only rule: whoever holds it may use the page.

Knows addresses and tokens; nothing of HTTP, the supervisor or the config file's layout.
"""

from __future__ import annotations

from typing import NamedTuple

from ..errors import ConfigError
from .schema import Checker, Key, Section, Table

DEFAULT_LISTEN = "127.0.0.1:8765"
MIN_TOKEN = 16  # characters: a token is a secret, not a password to remember


class Listen(NamedTuple):
    host: str  # as given: an IP literal (no brackets) or "localhost"
    port: int  # 0: the system picks one

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)

    def url_host(self) -> str:
        return f"[{self.host}]" if ":" in self.host else self.host

    def __str__(self) -> str:
        return f"{self.url_host()}:{self.port}"


class WebSettings(NamedTuple):
    """What `[web]` says: `listen` None when the page is not run beside the supervisor."""

    listen: Listen | None = None
    token: str | None = None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    import ipaddress  # here: every `ccsup` command parses the config, few need this

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_listen(value: object, *, where: str) -> Listen:
    """`HOST:PORT` -> Listen; ConfigError naming `where` otherwise."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: must be a string HOST:PORT such as {DEFAULT_LISTEN!r}")
    host, colon, port_text = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ConfigError(f"{where}: write an IPv6 address in brackets, [::1]:8765, not {value!r}")
    if not colon or not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ConfigError(f"{where}: must be HOST:PORT with a port 0-65535, not {value!r}")
    if host != "localhost":
        import ipaddress

        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise ConfigError(
                f"{where}: HOST must be an IP address or localhost, not {host!r} "
                "(a name could resolve to another address later)"
            ) from None
    return Listen(host, int(port_text))


def parse_token(value: object, *, where: str) -> str:
    if not isinstance(value, str) or len(value) < MIN_TOKEN or not value.isprintable():
        raise ConfigError(
            f"{where}: must be a string of at least {MIN_TOKEN} printable characters; make one with "
            "python3 -c 'import secrets; print(secrets.token_urlsafe(24))'"
        )
    if any(c.isspace() for c in value):
        raise ConfigError(f"{where}: must not contain spaces")
    return value


def check_exposure(listen: Listen, token: str | None, *, where: str) -> None:
    """A non-loopback listen without a token is refused (ConfigError naming `where`)."""
    if token is None and not listen.loopback:
        raise ConfigError(
            f"{where}: {listen} is not a loopback address, so [web] token must be set "
            "(every request must then carry it)"
        )


KEYS = ("listen", "token")
# The `[web]` section as `ccsup config init` documents it: (key, example, doc).
DOCS = (
    (
        "listen",
        DEFAULT_LISTEN,
        "Run `ccsup web` beside the supervisor, serving the live page here (default: not run;\n"
        "`ccsup web` alone serves on 127.0.0.1:8765). An address that is not loopback needs token.",
    ),
    (
        "token",
        "replace-with-a-random-secret-of-24-characters",
        "The page's secret: a bearer token, or the login form's (`ccsup web` prints a one-time\n"
        "login URL). Once set, every request needs it, on loopback too. Keep this file chmod 600.",
    ),
)


def parse_web(table: dict) -> tuple[WebSettings, list[tuple[tuple[str, ...], str]]]:
    """The `[web]` table -> (settings, problems as (key path, message)). Pure; unknown keys are
    the caller's to report (the config's known-key check)."""
    problems: list[tuple[tuple[str, ...], str]] = []
    listen = token = None
    try:
        if "token" in table:
            token = parse_token(table["token"], where="web.token")
    except ConfigError as e:
        problems.append((("web", "token"), e.message.removeprefix("web.token: ")))
    try:
        if "listen" in table:
            listen = parse_listen(table["listen"], where="web.listen")
            if "token" not in table:
                check_exposure(listen, token, where="web.listen")
    except ConfigError as e:
        problems.append((("web", "listen"), e.message.removeprefix("web.listen: ")))
    return WebSettings(listen, token), problems


SECTION = Section(
    ("web",),
    "The live page (`ccsup web`), a client of the supervisor.",
    tuple(Key(name, value, doc, example=True) for name, value, doc in DOCS),
    example=True,
)


def parse_web_section(c: Checker, top: Table) -> WebSettings:
    settings, problems = parse_web(c.table(top, ("web",)))
    for path, message in problems:
        c.add(path, message)
    return settings
