"""`[metrics]`: where the supervisor serves its Prometheus figures (off unless `listen` is set)."""

from __future__ import annotations

from typing import NamedTuple

from ..errors import ConfigError
from .schema import Checker, Key, Section, Table
from .values import string

SECTION = Section(
    ("metrics",),
    "Prometheus metrics (`ccsup metrics` prints them without this).",
    (
        Key(
            "listen",
            "127.0.0.1:9464",
            "Serve /metrics over HTTP on host:port (default: not served). Only the address you\n"
            "write is used: a loopback address keeps it on this machine.",
            example=True,
        ),
    ),
)


def metrics_address(text: str, where: str = "metrics.listen") -> tuple[str, int]:
    """ "host:port", "[v6]:port", or a bare port (then 127.0.0.1) -> (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", text
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(
            f"{where}: {text!r} is not an address to listen on; write host:port, "
            'e.g. "127.0.0.1:9464"'
        )
    return host, int(port)


class MetricsSettings(NamedTuple):
    listen: str | None = None  # "host:port", checked


def _listen(value: object, *, where: str) -> str:
    text = string(value, where=where)
    metrics_address(text, where)
    return text


def parse_metrics(c: Checker, top: Table) -> MetricsSettings:
    table = c.table(top, ("metrics",))
    if "listen" not in table:
        return MetricsSettings()
    return MetricsSettings(listen=c.run(("metrics", "listen"), _listen, table["listen"]))
