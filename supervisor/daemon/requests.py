"""One table routes every request to the supervisor, from the control socket and the bus alike.

An entry is a request's name (a control `cmd`, or the kind of a bus `request.<kind>` topic: the
names of supervisor.wire.protocol's COMMANDS and REQUEST_TOPICS), how its arguments are read
(supervisor.wire.args: a ProtocolError names the field, and nothing changes), and what the
supervisor does with them. What differs by where a request came from (who paused a key, a quota
reading's source) is the `source` each action gets: "control" or "bus". The bus carries only the
requests marked `bus`, whose actions are quick and synchronous, taken in the order they came; the
control socket awaits an action that waits (status, ps and reap read files in a thread).

Knows the daemon's parts by name (manager, keyctl, the daemon's own status, ps, reap, reload,
quit and quota); holds no state.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..admission.control import KeyControl
from ..history.metrics import Metrics
from ..turns.manager import Manager
from ..wire import args as parse


class Daemon(Protocol):
    """What the table asks of the daemon (supervisor.daemon.main.Daemon)."""

    manager: Manager
    keyctl: KeyControl
    metrics: Metrics

    async def status(self) -> dict: ...
    async def ps(self) -> dict: ...
    async def reap(self, key: str | None) -> dict: ...
    def reload(self) -> dict: ...
    def quit_request(self, args: dict) -> dict: ...
    def quota(self, args: parse.QuotaArgs, *, source: str) -> dict: ...


Source = str  # "control" or "bus"


@dataclass(frozen=True)
class Route:
    read: Callable[[dict, Source], Any]  # the request's arguments, checked
    act: Callable[[Daemon, Any, Source], dict | Awaitable[dict]]
    bus: bool = False  # also a bus request (`request.<name>`)


def _none(args: dict, source: Source) -> None:
    return None


def _quota_args(args: dict, source: Source) -> parse.QuotaArgs:
    return parse.parse_quota(args, bus=source == "bus")


def _quota(d: Daemon, a: parse.QuotaArgs, source: Source) -> dict:
    return d.quota(a, source="bus" if source == "bus" else a.source)


ROUTES: dict[str, Route] = {
    "status": Route(_none, lambda d, a, s: d.status()),
    "ps": Route(_none, lambda d, a, s: d.ps()),
    "metrics": Route(_none, lambda d, a, s: {"text": d.metrics.exposition().decode()}),
    "reload": Route(_none, lambda d, a, s: d.reload()),
    "reap": Route(lambda a, s: parse.parse_reap(a), lambda d, a, s: d.reap(a)),
    "quit": Route(lambda a, s: a, lambda d, a, s: d.quit_request(a)),
    "turn": Route(
        lambda a, s: parse.parse_turn(a), lambda d, a, s: d.manager.request_turn(a), bus=True
    ),
    "reserve": Route(
        lambda a, s: parse.parse_reserve(a), lambda d, a, s: d.manager.reserve(a), bus=True
    ),
    "cancel": Route(
        lambda a, s: parse.parse_cancel(a),
        lambda d, a, s: d.manager.cancel(a, reason="cancelled"),
        bus=True,
    ),
    "send": Route(lambda a, s: parse.parse_send(a), lambda d, a, s: d.manager.send(a)),
    "pause": Route(
        lambda a, s: parse.parse_pause(a), lambda d, a, s: d.keyctl.pause(a, by=s), bus=True
    ),
    "resume": Route(lambda a, s: parse.parse_resume(a), lambda d, a, s: d.keyctl.resume(a)),
    "quota": Route(_quota_args, _quota, bus=True),
}


async def answer(daemon: Daemon, name: str, args: dict) -> dict:
    """A control request's answer (ProtocolError or CcsupError when it is refused)."""
    route = ROUTES[name]
    result = route.act(daemon, route.read(args, "control"), "control")
    if inspect.isawaitable(result):
        result = await result
    return result


def take(daemon: Daemon, name: str, args: dict) -> None:
    """A bus request, acted on at once (ProtocolError or CcsupError when it is refused)."""
    route = ROUTES[name]
    assert route.bus, f"{name} is not a bus request"
    result = route.act(daemon, route.read(args, "bus"), "bus")
    assert not inspect.isawaitable(result), f"the bus request {name} would wait"
