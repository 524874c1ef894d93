"""One turn followed by id within a bound, for `ccsup mcp` and `ccsup wait`: where it stands
(queued with its position, running, or ended with its status) and the tail of its output.

What already happened is read from the history file (the supervisor records every lifecycle event
as it publishes it); what comes next from a bus subscription made before that read, so nothing
falls between the two. The history's writer is a thread of the supervisor and may lag the bus by a
moment, both ways: a terminal event is followed by a short wait for the history to hold the end,
and an end published before the subscription was live but not yet written when the history was
read is found by reading it again after each second without an event.

Knows the client, the history's read side and the output logs' paths; nothing of MCP or click.
State: none of its own; following a turn changes nothing, so a retry (a reconnected MCP client,
`ccsup wait` run again) is always safe.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, TypedDict

from ..client.control import Client
from ..client.subscription import is_terminal
from ..errors import CcsupError, UnknownTurn
from ..history import db as history

TERMINAL = ("released", "cancelled", "rejected")
TAIL_BYTES = 4000  # of each stream, in an ended turn's answer
HISTORY_LAG = 3.0  # seconds to wait for the history to hold an end the bus announced
RECHECK = 1.0  # seconds without an event before the history is read again


class TurnView(TypedDict, total=False):
    id: str
    key: str
    state: str  # queued | running | ended
    position: int | None
    outcome: str | None  # history.OUTCOMES, once ended
    exit_code: int | None
    signal: int | None
    reason: str | None
    stdout_tail: str
    stderr_tail: str
    stdout_log: str
    stderr_log: str
    session: str | None


def passed_env() -> dict[str, str]:
    """This process's environment as a turn's `env` (the agent's: PATH, virtualenvs, keys), less
    what JSON cannot carry exactly (names or values that are not UTF-8)."""
    env = {}
    for name, value in os.environ.items():
        try:
            name.encode()
            value.encode()
        except UnicodeEncodeError:
            continue
        if name and "=" not in name:
            env[name] = value
    return env


def _story(client: Client, turn_id: str) -> dict[str, Any] | None:
    try:
        found = history.show(client.state_dir, turn_id)
    except history.HistoryError:
        return None  # no history yet (a supervisor that never ran a turn): nothing known
    return dict(found) if found is not None else None


def _live(client: Client, turn_id: str) -> dict[str, Any] | None:
    """The turn as `ps` sees it: waiting (with its position) or holding a slot."""
    ps = client.ps()
    for wait in ps.get("waits", []):
        if wait.get("id") == turn_id:
            return {"state": "queued", "position": wait.get("position"), "key": wait.get("key")}
    for slot in ps.get("slots", []):
        if slot.get("turn") == turn_id:
            return {"state": "running", "position": None, "key": slot.get("key")}
    return None


def tail(client: Client, turn_id: str, stream: str, size: int = TAIL_BYTES) -> str:
    path = client.paths.output_log(turn_id, stream)
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            end = f.tell()
            f.seek(max(0, end - size))
            data = f.read()
    except FileNotFoundError:
        return ""
    except OSError as e:
        raise CcsupError(f"unable to read {path}: {e.strerror}") from None
    return data.decode("utf-8", "replace")


def ended_view(client: Client, story: dict[str, Any]) -> TurnView:
    turn_id = story["id"]
    return TurnView(
        id=turn_id,
        key=story["key"],
        state="ended",
        position=None,
        outcome=story.get("outcome"),
        exit_code=story.get("exit_code"),
        signal=story.get("signal"),
        reason=story.get("reason"),
        stdout_tail=tail(client, turn_id, "stdout"),
        stderr_tail=tail(client, turn_id, "stderr"),
        stdout_log=str(client.paths.output_log(turn_id, "stdout")),
        stderr_log=str(client.paths.output_log(turn_id, "stderr")),
        session=(story.get("holder") or {}).get("session"),
    )


def current(client: Client, turn_id: str) -> TurnView | None:
    """Where the turn stands now; None when neither the history nor the supervisor knows it."""
    story = _story(client, turn_id)
    if story is not None and story.get("state") in TERMINAL:
        return ended_view(client, story)
    live = _live(client, turn_id)
    if live is not None:
        return TurnView(id=turn_id, key=live["key"], state=live["state"], position=live["position"])
    if story is not None:  # between two states (granted, not yet in ps; or just ended)
        state = "queued" if story.get("state") == "queued" else "running"
        return TurnView(id=turn_id, key=story["key"], state=state, position=None)
    return None


def follow(
    client: Client,
    turn_id: str,
    bound: float,
    *,
    request: Callable[[], dict] | None = None,
    tick: float = 5.0,
    on_tick: Callable[[float, TurnView | None], None] | None = None,
) -> TurnView:
    """The turn's end if it comes within `bound` seconds, else where it stands then.

    `request` (a turn request) is sent once the subscription is live; without it the turn must
    exist already, else UnknownTurn. `on_tick(elapsed, view)` runs every `tick`
    seconds while it waits (the MCP server's progress notifications).
    """
    started = time.monotonic()
    deadline = started + bound
    with client.subscribe([f"turn.{turn_id}."]) as sub:
        if request is not None:
            sub.expect_turn(turn_id)
            request()
        else:
            view = current(client, turn_id)
            if view is None:
                raise UnknownTurn(turn_id, client.state_dir)
            if view["state"] == "ended":
                return view
        next_tick = started + tick
        next_check = time.monotonic() + RECHECK
        ended = False
        while not ended:
            now = time.monotonic()
            if now >= deadline:
                break
            event = sub.recv(max(0.0, min(deadline, next_tick, next_check) - now))
            if event is not None and is_terminal(event[0]):
                ended = True
            elif time.monotonic() >= next_check:
                # An end published before the subscription was live, which the history had not
                # yet written when it was read: the history has it by now.
                next_check = time.monotonic() + RECHECK
                client.check_running()
                story = _story(client, turn_id)
                ended = story is not None and story.get("state") in TERMINAL
            if on_tick is not None and time.monotonic() >= next_tick:
                next_tick += tick
                on_tick(time.monotonic() - started, current(client, turn_id))
        if ended:
            lag_end = time.monotonic() + HISTORY_LAG
            while time.monotonic() < lag_end:
                story = _story(client, turn_id)
                if story is not None and story.get("state") in TERMINAL:
                    return ended_view(client, story)
                time.sleep(0.05)
    view = current(client, turn_id)
    if view is None:
        raise CcsupError(f"turn {turn_id} is not known to the supervisor on {client.state_dir}")
    return view
