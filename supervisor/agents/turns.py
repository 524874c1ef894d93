"""One turn followed by id within a bound, for `ccsup mcp` and `ccsup wait`: where it stands
(queued with its position, running, or ended with its status) and the tail of its output.

What already happened is read from the history file (the supervisor records every lifecycle event
as it publishes it); what comes next from a bus subscription made before that read, so nothing
falls between the two. The history's writer is a thread of the supervisor and may lag the bus by a
moment, both ways: a terminal event is followed by a short wait for the history to hold the end,
and an end published before the subscription was live but not yet written when the history was
read is found by reading it again after a second without an event (then after 2, 4, 8 s).

Waiting holds no thread: `follow` is a coroutine that waits on the subscription's socket and the
supervisor's pidfd on the event loop (zmq.asyncio's poller), and hands only the short blocking
calls (a control request, a history read) to a worker thread. So an MCP server with hundreds of
calls in flight runs a handful of threads; `ccsup wait` runs the same coroutine (asyncio.run).
It rides through the supervisor's death as `ccsup run` does (supervisor.client.ride_through).

Knows the client, the history's read side and the output logs' paths; nothing of MCP or click.
State: none of its own; following a turn changes nothing, so a retry (a reconnected MCP client,
`ccsup wait` run again) is always safe.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypedDict, TypeVar

import zmq

from ..client.control import Client
from ..client.ride_through import IDLE, POLL, RETURN_MARGIN, Watch, await_return_async
from ..client.subscription import Subscription, is_terminal
from ..errors import CcsupError, SupervisorLost, UnknownTurn
from ..history import db as history

T = TypeVar("T")

TERMINAL = ("released", "cancelled", "rejected")
TAIL_BYTES = 4000  # of each stream, in an ended turn's answer
HISTORY_LAG = 3.0  # seconds to wait for the history to hold an end the bus announced
RECHECK = 1.0  # seconds without an event before the history is read again (then twice as long)
RECHECK_MAX = 8.0  # seconds between two readings of the history, at most


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


def _story(client: Client, turn_id: str) -> dict[str, Any] | None:
    try:
        found = history.show(client.state_dir, turn_id)
    except history.HistoryError:
        return None  # no history yet (a supervisor that never ran a turn): nothing known
    return dict(found) if found is not None else None


class RecentPs:
    """One `ps` shared by the calls that ask within `fresh` seconds of each other: an MCP server
    whose hundreds of calls reach their bound together asks the supervisor once, not once each.
    Thread-safe (the lock is held while its own client asks)."""

    def __init__(self, make_client: Callable[[], Client], fresh: float = 0.5):
        self._make_client = make_client
        self._fresh = fresh
        self._lock = threading.Lock()
        self._client: Client | None = None
        self._at = float("-inf")
        self._ps: dict = {}

    def __call__(self) -> dict:
        with self._lock:
            if time.monotonic() - self._at > self._fresh:
                if self._client is None:
                    self._client = self._make_client()
                self._ps = self._client.ps()
                self._at = time.monotonic()
            return self._ps

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


def _live(
    client: Client, turn_id: str, ps_of: Callable[[], dict] | None = None
) -> dict[str, Any] | None:
    """The turn as `ps` sees it: waiting (with its position) or holding a slot; None when the
    supervisor does not know it, or none answers (between two supervisors)."""
    try:
        ps = (ps_of or client.ps)()
    except CcsupError:
        if client.running():
            raise
        return None
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


def current(
    client: Client, turn_id: str, ps_of: Callable[[], dict] | None = None
) -> TurnView | None:
    """Where the turn stands now; None when neither the history nor the supervisor knows it.
    `ps_of`: where `ps` comes from (a RecentPs), else the client's own request."""
    story = _story(client, turn_id)
    if story is not None and story.get("state") in TERMINAL:
        return ended_view(client, story)
    live = _live(client, turn_id, ps_of)
    if live is not None:
        return TurnView(id=turn_id, key=live["key"], state=live["state"], position=live["position"])
    if story is not None:  # between two states (granted, not yet in ps; or just ended)
        state = "queued" if story.get("state") == "queued" else "running"
        return TurnView(id=turn_id, key=story["key"], state=state, position=None)
    return None


def _ended(story: dict[str, Any] | None) -> bool:
    return story is not None and story.get("state") in TERMINAL


async def _offload(work: Callable[[], T]) -> T:
    return await asyncio.to_thread(work)


async def _next_event(sub: Subscription, watch: Watch, timeout: float) -> tuple[str, dict] | None:
    """The subscription's next event within `timeout`, or None at the timeout or as soon as the
    supervisor is gone; the wait holds no thread: the socket's descriptor and the pidfd are
    watched by the event loop (zmq's descriptor is edge-triggered: ZMQ_EVENTS is asked first,
    which also clears it, so a wake-up with nothing to read costs one loop)."""
    event = sub.recv(0)
    if event is not None or timeout <= 0:
        return event
    pidfd = watch.fileno()
    if pidfd is None:
        timeout = min(timeout, IDLE)  # no pidfd: the lock is asked after each quiet moment
    sock = sub.socket
    if not int(sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
        loop = asyncio.get_running_loop()
        woken = loop.create_future()

        def wake() -> None:
            if not woken.done():
                woken.set_result(None)

        fds = [int(sock.getsockopt(zmq.FD)), *([] if pidfd is None else [pidfd])]
        for fd in fds:
            loop.add_reader(fd, wake)
        try:
            await asyncio.wait_for(woken, timeout)
        except TimeoutError:
            pass
        finally:
            for fd in fds:
                loop.remove_reader(fd)
    return sub.recv(0)


async def follow(
    client: Client,
    turn_id: str,
    bound: float,
    *,
    request: Callable[[], dict] | None = None,
    tick: float = 5.0,
    on_tick: Callable[[float, TurnView | None], Awaitable[None]] | None = None,
    down_wait: float = 0.0,
    offload: Callable[[Callable[[], Any]], Awaitable[Any]] = _offload,
    ps_of: Callable[[], dict] | None = None,
) -> TurnView:
    """The turn's end if it comes within `bound` seconds, else where it stands then.

    `request` (a turn request) is sent once the subscription is live; without it the turn must
    exist already, else UnknownTurn. `on_tick(elapsed, view)` is awaited every
    `tick` seconds while it waits (the MCP server's progress notifications). Every blocking
    call (control requests, the history) goes through `offload` (a worker thread); waiting for
    events holds none.

    It rides through its supervisor's death as `ccsup run` does (supervisor.client.ride_through):
    it waits for the next one up to adopt_within + 5 s, subscribes again, and reads the turn's
    story again. Asked without `request` while no supervisor runs, for a turn the history knows
    and has not seen end (a supervisor killed before it), it waits `down_wait` seconds for one.
    SupervisorLost (exit 71) when none came back in time; at the bound, where the turn stands.
    """
    clock = time.monotonic
    deadline = clock() + bound
    story: dict[str, Any] | None = None
    if request is None:
        story = await offload(lambda: _story(client, turn_id))
        if story is not None and _ended(story):
            return await offload(lambda: ended_view(client, story))  # no supervisor needed
    if request is not None or story is None or await offload(client.running):
        status = await offload(client.status)  # NotRunning (exit 3) when none runs
    else:  # killed with the turn still in its care: wait for the next supervisor
        status = await await_return_async(client, min(bound, down_wait), offload)
        if status is None:
            if clock() >= deadline:
                return await _where(client, turn_id, offload)
            raise SupervisorLost(
                f"no supervisor answered on {client.state_dir} within {down_wait:g} s "
                f"(adopt_within + {RETURN_MARGIN:g} s): turn {turn_id}'s end is not known"
            )
    follower = _Follower(client, turn_id, Watch(client, status), offload, ps_of)
    try:
        return await follower.run(deadline, request, tick, on_tick)
    except _EndedOnFile as e:
        return e.view
    finally:
        follower.close()


class _EndedOnFile(Exception):
    """No supervisor came back, and the files say how the turn ended."""

    def __init__(self, view: TurnView):
        self.view = view


def on_file(client: Client, turn_id: str) -> TurnView | str:
    """With no supervisor answering: what the state directory's files say of the turn (as
    ride_through's TurnRider.on_file): its end from the history, or from its guard's record when
    its command ended by itself; "queued" when the history has it queued and no guard ran it
    (it waits in queue.json for the next supervisor); else "unknown"."""
    from ..client.ride_through import guard_record_of, recorded_end

    story = _story(client, turn_id)
    if story is not None and _ended(story):
        return ended_view(client, story)
    record = guard_record_of(client.paths.guards, turn_id)
    if record is not None:
        end = recorded_end(record)
        if end is None:
            return "unknown"
        signal = end.get("signal")
        return TurnView(
            id=turn_id,
            key=(story or {}).get("key") or "",
            state="ended",
            position=None,
            outcome="exit",
            exit_code=None if isinstance(signal, int) else end.get("code"),
            signal=signal if isinstance(signal, int) else None,
            reason=None,
            stdout_tail=tail(client, turn_id, "stdout"),
            stderr_tail=tail(client, turn_id, "stderr"),
            stdout_log=str(client.paths.output_log(turn_id, "stdout")),
            stderr_log=str(client.paths.output_log(turn_id, "stderr")),
            session=((story or {}).get("holder") or {}).get("session"),
        )
    if story is not None and story.get("state") == "queued":
        return "queued"
    return "unknown"


class _Gone(Exception):
    """The supervisor died under a request: the follower rides through to the next."""


class _Follower:
    """One follow: the watched supervisor run, the live subscription (None while riding
    through), and whether the turn's request was answered."""

    def __init__(self, client: Client, turn_id: str, watch: Watch, offload, ps_of):
        self.ps_of = ps_of
        self.client = client
        self.turn_id = turn_id
        self.watch = watch
        self.offload = offload
        self.sub: Subscription | None = None

    async def ask(self, work: Callable[[], T]) -> T:
        """work() in a worker thread; _Gone when it failed because the supervisor died."""
        try:
            result: T = await self.offload(work)
            return result
        except CcsupError:
            if self.watch.gone():
                raise _Gone() from None
            raise

    async def run(self, deadline: float, request, tick: float, on_tick) -> TurnView:
        clock = time.monotonic
        asked = request is None  # the turn's request answered (a retry is safe: same id)
        first = True
        started = clock()
        next_tick = started + tick
        next_check = clock() + RECHECK  # the history, for an end the bus did not bring
        check_every = RECHECK
        ended = False
        while not ended and clock() < deadline:
            try:
                if self.sub is None:
                    sub = await self.connect(deadline)
                    if sub is None:
                        break  # the bound came first: where the turn stands
                    if not asked:
                        if first:
                            sub.expect_turn(self.turn_id)
                        await self.ask(request)
                        asked = True
                        if first:
                            next_check = deadline + 1  # the subscription is older than the turn
                    elif first:
                        view = await self.ask(
                            lambda: current(self.client, self.turn_id, self.ps_of)
                        )
                        if view is None:
                            raise UnknownTurn(self.turn_id, self.client.state_dir)
                        if view["state"] == "ended":
                            return view
                    else:  # after a restart: its end may be in the history already
                        next_check, check_every = clock(), RECHECK
                    first = False
                    continue
                wake = min(deadline, next_check, next_tick if on_tick is not None else deadline)
                event = await _next_event(self.sub, self.watch, wake - clock())
                if event is not None:
                    ended = is_terminal(event[0])
                    continue
                if self.watch.gone():
                    raise _Gone()
                if clock() >= next_check:
                    # An end published before the subscription was live (or while no supervisor
                    # ran), which the history had not yet written when it was read: it has it.
                    ended = _ended(await self.offload(lambda: _story(self.client, self.turn_id)))
                    check_every = min(check_every * 2, RECHECK_MAX)
                    next_check = clock() + check_every
                if on_tick is not None and clock() >= next_tick:
                    next_tick += tick
                    view = await self.ask(lambda: current(self.client, self.turn_id, self.ps_of))
                    await on_tick(clock() - started, view)
            except _Gone:
                self.drop_subscription()
        if ended:
            lag_end = clock() + HISTORY_LAG
            while clock() < lag_end:
                view = await self.offload(lambda: _ended_view_if_ended(self.client, self.turn_id))
                if view is not None:
                    return view
                await asyncio.sleep(0.05)
        return await _where(self.client, self.turn_id, self.offload, self.ps_of)

    async def connect(self, deadline: float) -> Subscription | None:
        """A live subscription on this supervisor, else on the next one to answer within the
        wait limit (SupervisorLost past it); None when `deadline` comes first."""
        gone_at = time.monotonic()
        while True:
            if not self.watch.gone():
                self.sub = await _subscribe(self.client, self.turn_id, self.watch, self.offload)
                if self.sub is not None:
                    return self.sub
            until = min(deadline, gone_at + self.watch.wait_limit)
            status = await await_return_async(self.client, until - time.monotonic(), self.offload)
            if status is None:
                if time.monotonic() >= deadline:
                    return None
                found = await self.offload(lambda: on_file(self.client, self.turn_id))
                if found == "queued":  # restored by whichever supervisor starts next
                    gone_at = time.monotonic()
                    continue
                if not isinstance(found, str):
                    raise _EndedOnFile(found)
                raise watch_lost(self.client, self.watch, self.turn_id)
            self.watch.close()
            self.watch = Watch(self.client, status)

    def drop_subscription(self) -> None:
        if self.sub is not None:
            self.sub.close()
            self.sub = None

    def close(self) -> None:
        self.drop_subscription()
        self.watch.close()


def _ended_view_if_ended(client: Client, turn_id: str) -> TurnView | None:
    story = _story(client, turn_id)
    return ended_view(client, story) if story is not None and _ended(story) else None


async def _where(client: Client, turn_id: str, offload, ps_of=None) -> TurnView:
    view = await offload(lambda: current(client, turn_id, ps_of))
    if view is None:
        raise CcsupError(f"turn {turn_id} is not known to the supervisor on {client.state_dir}")
    return view


async def _subscribe(client: Client, turn_id: str, watch: Watch, offload) -> Subscription | None:
    """A live subscription to the turn's topics, asked again while the supervisor is busy
    (starting, adopting) up to its wait limit; None when it is gone first."""
    give_up = time.monotonic() + watch.wait_limit
    while True:
        try:
            return await offload(lambda: client.subscribe([f"turn.{turn_id}."]))
        except CcsupError:
            if watch.gone():
                return None
            if time.monotonic() >= give_up:
                raise
        await asyncio.sleep(POLL)


def watch_lost(client: Client, watch: Watch, turn_id: str) -> SupervisorLost:
    return SupervisorLost(
        f"the supervisor on {client.state_dir} is gone and none answered within "
        f"{watch.wait_limit:g} s (adopt_within {watch.adopt_within:g} s + {RETURN_MARGIN:g} s): "
        f"turn {turn_id}'s end is not known"
    )
