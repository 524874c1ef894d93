"""`[otel]`: where the supervisor exports one OpenTelemetry span per turn (supervisor.daemon.otel).

Off unless `endpoint` is set: an OTLP/HTTP base URL (`http://127.0.0.1:4318`, a collector's
default), to which `/v1/traces` is added. Read at start (a `reload` does not change it).
"""

from __future__ import annotations

from typing import NamedTuple
from urllib.parse import urlsplit

from ..errors import ConfigError
from .schema import Checker, Key, Section, Table

SECTION = Section(
    ("otel",),
    "OpenTelemetry: one span per turn (waiting, running, stopping as its events), over OTLP.",
    (
        Key(
            "endpoint",
            "http://127.0.0.1:4318",
            "An OTLP/HTTP collector's base URL (JSON to <endpoint>/v1/traces); unset: none sent.",
            example=True,
        ),
    ),
)


class OtelSettings(NamedTuple):
    endpoint: str | None = None


def _endpoint(value: object, *, where: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f'{where}: write a URL such as "http://127.0.0.1:4318"')
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{where}: {value!r} is not an http:// or https:// URL with a host")
    return value


def parse_otel(c: Checker, top: Table) -> OtelSettings:
    table = c.table(top, ("otel",))
    endpoint = (
        c.run(("otel", "endpoint"), _endpoint, table["endpoint"]) if "endpoint" in table else None
    )
    return OtelSettings(endpoint=endpoint)
