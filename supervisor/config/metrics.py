"""`[metrics]`: where the supervisor serves its Prometheus figures (off unless `listen` is set)."""

from __future__ import annotations

from typing import NamedTuple

from ..metrics import parse_listen
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


class MetricsSettings(NamedTuple):
    listen: str | None = None  # "host:port", checked


def _listen(value: object, *, where: str) -> str:
    text = string(value, where=where)
    parse_listen(text, where)
    return text


def parse_metrics(c: Checker, top: Table) -> MetricsSettings:
    table = c.table(top, ("metrics",))
    if "listen" not in table:
        return MetricsSettings()
    return MetricsSettings(listen=c.run(("metrics", "listen"), _listen, table["listen"]))
