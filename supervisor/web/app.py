"""The web app (aiohttp): pages, the JSON API, the live streams, and cancel.

Routes:
  GET  /                          the main page (keys, holders, queue, timeline)
  GET  /turn/<id>                 a turn's page (events, output, usage, cancel)
  GET  /static/<file>             the page's CSS and JavaScript (no build step, nothing remote)
  GET  /api/state                 the state now and the last hour's bars, JSON
  GET  /api/events[?turn=<id>]    server-sent events: `state` (whole), `bars` (changed bars;
                                  `full` on connect), and with ?turn= `turn` (that turn's view)
  GET  /api/turn/<id>             a turn's view, JSON (404 when neither seen nor running)
  GET  /api/turn/<id>/output?stream=stdout|stderr[&tail=BYTES]
                                  server-sent events: `chunk` {offset, text} read from the turn's
                                  log file (exact bytes, decoded as UTF-8 across chunk edges;
                                  bytes that are not UTF-8 show as U+FFFD), then `end`; with tail,
                                  first `skipped` {bytes} when the log was longer
  POST /api/turn/<id>/cancel      cancel the turn through the control socket
  GET  /login?code=<one-time>     set the session cookie; POST /login (token=...) likewise

Design note. The app is a client: it holds no supervisor state of its own beyond what the page
shows (supervisor.web.live), re-reads `ps` when an event says something changed (coalesced, at
most every REFRESH_MIN seconds, and every REFRESH_MAX seconds regardless, so ages and CPU move),
and pushes one snapshot to every open page. A page that cannot keep up (its queue full) is
dropped; its EventSource reconnects and gets a fresh snapshot. Per-connection memory is bounded.

Knows HTTP and the page's routes; the supervisor only through Link, who may do what through
supervisor.web.access.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import resources
from pathlib import Path
from typing import Any

from aiohttp import web

from ..client import RemoteError
from ..errors import CcsupError, NotRunning
from ..paths import TURN_ID, StatePaths
from . import usage as usage_mod
from .access import COOKIE, CSRF_HEADER, Gate
from .link import Link
from .live import KEEP_SECONDS, Live, TurnView
from .settings import Listen
from .timeline import history_bars, past_turn, recent_bars

log = logging.getLogger("ccsup.web")

REFRESH_MIN = 0.1  # seconds between two `ps` reads at most
REFRESH_MAX = 2.0  # seconds between two `ps` reads at least
USAGE_EVERY = 2.0  # seconds between two CPU/memory samples of the running turns
STREAM_QUEUE = 64  # messages a slow page may be behind before it is dropped
READ_CHUNK = 64 * 1024
OUTPUT_IDLE = 1.0  # seconds an output stream waits for a bus hint before it looks at the file

STATIC = ("app.js", "turn.js", "common.js", "style.css")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Hub:
    """The live model, its refresher and the open streams, on the app's event loop."""

    def __init__(self, link: Link, state_dir: Path):
        self.link = link
        self.paths = StatePaths(state_dir)
        self.live = Live()
        self.usage: dict[str, tuple[float, int]] = {}
        self.streams: set[asyncio.Queue[tuple[str, Any] | None]] = set()
        self.output_wakers: dict[str, set[asyncio.Event]] = {}
        self._dirty = asyncio.Event()
        self._tasks: list[asyncio.Task] = []

    # -- in

    def on_event(self, topic: str, body: dict) -> None:
        if topic == "ccsup.gap":
            self._dirty.set()
            return
        if self.live.apply_event(topic, body):
            self._dirty.set()
        parts = topic.split(".")
        if parts[0] == "turn" and len(parts) >= 3:
            turn_id = ".".join(parts[1:-1])
            for waker in self.output_wakers.get(turn_id, ()):
                waker.set()
            if parts[-1] not in ("stdout", "stderr"):
                self._broadcast("turn", turn_id)

    def on_status(self, connected: bool, reason: str | None) -> None:
        if connected:
            self._dirty.set()
        else:
            self.live.lost(reason or "not connected")
            self._broadcast("state", None)

    # -- the refresher

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.link.start_reader(loop, self.on_event, self.on_status)
        self._tasks = [
            asyncio.create_task(self._refresh_loop(), name="ccsup-web-refresh"),
            asyncio.create_task(self._usage_loop(), name="ccsup-web-usage"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for queue in list(self.streams):
            self._close_stream(queue)
        await asyncio.get_running_loop().run_in_executor(None, self.link.close)

    async def refresh(self) -> None:
        asked_at = self.live.clock()
        try:
            ps = await self.link.call("ps")
            status = await self.link.call("status")
        except CcsupError as e:
            self.live.lost(e.message)
        else:
            self.live.apply_ps(ps, status, asked_at)
            self.live.expire()
        self._broadcast("state", None)
        changed = self.live.take_changed_bars()
        if changed:
            self._broadcast("bars", {"full": False, "bars": changed})

    async def _refresh_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(REFRESH_MAX):
                    await self._dirty.wait()
            self._dirty.clear()
            await self.refresh()
            await asyncio.sleep(REFRESH_MIN)

    async def _usage_loop(self) -> None:
        while True:
            if not self.streams:  # nobody looks: no pass over /proc
                self.usage = {}
                await asyncio.sleep(USAGE_EVERY)
                continue
            works = usage_mod.works_of(self.live.ps.get("slots", []))
            samples = await self.link.run(usage_mod.sample, works)
            self.usage = {turn: (s.cpu_seconds, s.rss_bytes) for turn, s in samples.items()}
            await asyncio.sleep(USAGE_EVERY)

    # -- out

    def state(self) -> dict:
        return dict(self.live.state(self.usage))

    async def bars(self) -> list:
        since = time.time() - KEEP_SECONDS
        past = await self.link.run(history_bars, self.paths.root, since)
        return list(recent_bars(self.live, since, past))

    async def turn(self, turn_id: str) -> TurnView | None:
        """A turn's view: what the bus showed, else (or when it showed no event) the history's."""
        view = self.live.turn(turn_id)
        if view is None or not view["events"]:
            past = await self.link.run(past_turn, self.paths.root, turn_id)
            if past is not None:
                if view is not None:
                    past["active"] = view["active"]
                return past
        return view

    def _broadcast(self, kind: str, data: Any) -> None:
        for queue in list(self.streams):
            try:
                queue.put_nowait((kind, data))
            except asyncio.QueueFull:
                self._close_stream(queue)

    def _close_stream(self, queue: asyncio.Queue) -> None:
        self.streams.discard(queue)
        with contextlib.suppress(asyncio.QueueFull):
            queue.put_nowait(None)

    @contextlib.asynccontextmanager
    async def stream(self) -> AsyncIterator[asyncio.Queue[tuple[str, Any] | None]]:
        queue: asyncio.Queue[tuple[str, Any] | None] = asyncio.Queue(STREAM_QUEUE)
        self.streams.add(queue)
        try:
            yield queue
        finally:
            self.streams.discard(queue)


# -- HTTP ------------------------------------------------------------------------------------------

HUB = web.AppKey("hub", Hub)
GATE = web.AppKey("gate", Gate)


def _page(name: str, csrf: str) -> str:
    text = resources.files(__package__).joinpath("static", name).read_text()
    return text.replace("{{csrf}}", csrf)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(
        text=json.dumps(data, ensure_ascii=False), status=status, content_type="application/json"
    )


def _error(status: int, message: str) -> web.Response:
    return _json({"error": message}, status)


@web.middleware
async def access_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    gate = request.app[GATE]
    host = request.headers.get("Host")
    verdict = gate.check_host(host)
    # The login page and the page's own code are public (no data); everything else needs the token.
    public = request.path == "/login" or request.path.startswith("/static/")
    if verdict.status == 0 and not public:
        verdict = gate.check_auth(request.headers.get("Authorization"), request.cookies.get(COOKIE))
        if (
            verdict.status == 401
            and request.method == "GET"
            and not request.path.startswith("/api/")
        ):
            return web.Response(text=_page("login.html", ""), status=401, content_type="text/html")
    if verdict.status == 0:
        verdict = gate.check_change(
            request.method,
            host,
            request.headers.get("Origin"),
            request.headers.get(CSRF_HEADER),
            request.headers.get("Authorization"),
            login=request.path == "/login",
        )
    if verdict.status:
        return _error(verdict.status, verdict.reason)
    response = await handler(request)
    # The page never runs framed (a cancel button under someone else's page) nor loads anything
    # from elsewhere.
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["Content-Security-Policy"] = (
        "default-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
    )
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    return response


async def index(request: web.Request) -> web.Response:
    return web.Response(text=_page("index.html", request.app[GATE].csrf), content_type="text/html")


async def turn_page(request: web.Request) -> web.Response:
    _turn_id(request)
    return web.Response(text=_page("turn.html", request.app[GATE].csrf), content_type="text/html")


async def static(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in STATIC:
        raise web.HTTPNotFound()
    kind = "text/css" if name.endswith(".css") else "text/javascript"
    text = resources.files(__package__).joinpath("static", name).read_text()
    return web.Response(text=text, content_type=kind, headers={"Cache-Control": "no-cache"})


async def api_state(request: web.Request) -> web.Response:
    hub = request.app[HUB]
    return _json({"state": hub.state(), "bars": await hub.bars(), "now": time.time()})


async def _sse(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
        }
    )
    await response.prepare(request)
    return response


async def _send(response: web.StreamResponse, kind: str, data: Any) -> None:
    payload = json.dumps(data, ensure_ascii=False)
    await response.write(f"event: {kind}\ndata: {payload}\n\n".encode())


async def api_events(request: web.Request) -> web.StreamResponse:
    with contextlib.suppress(ConnectionResetError):  # the page went away mid-write
        return await _events(request)
    return web.Response()  # never sent: the connection is gone


async def _events(request: web.Request) -> web.StreamResponse:
    hub = request.app[HUB]
    watch = request.query.get("turn")
    if watch is not None and not TURN_ID.match(watch):
        raise web.HTTPBadRequest(text="bad turn id")
    async with hub.stream() as queue:
        response = await _sse(request)
        await _send(response, "state", {**hub.state(), "now": time.time()})
        await _send(response, "bars", {"full": True, "bars": await hub.bars(), "now": time.time()})
        if watch is not None:
            await _send(response, "turn", await hub.turn(watch))
        while True:
            try:
                async with asyncio.timeout(15):
                    message = await queue.get()
            except TimeoutError:
                await response.write(b": keep-alive\n\n")
                continue
            if message is None:
                break  # dropped: too slow, or the app is ending
            kind, data = message
            if kind == "state":
                await _send(response, "state", {**hub.state(), "now": time.time()})
            elif kind == "bars":
                await _send(response, "bars", {**data, "now": time.time()})
            elif kind == "turn" and watch is not None and data == watch:
                await _send(response, "turn", await hub.turn(watch))
    return response


def _turn_id(request: web.Request) -> str:
    turn_id = request.match_info["id"]
    if not TURN_ID.match(turn_id):
        raise web.HTTPNotFound(text="no such turn")
    return turn_id


async def api_turn(request: web.Request) -> web.Response:
    view = await request.app[HUB].turn(_turn_id(request))
    if view is None:
        return _error(404, "this page has not seen that turn, and it is not running now")
    return _json(view)


class LogReader:
    """A turn's log file read from an offset, decoded as UTF-8 across chunk edges.

    `tail`: start at most this many bytes before the end as it is at the first read (moved
    forward past UTF-8 continuation bytes, so the first character is whole); `skipped` says how
    many bytes were left out before it.
    """

    def __init__(self, path: Path, tail: int | None = None):
        self.path = path
        self.offset = 0
        self.tail = tail
        self.skipped = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def _start(self, f) -> None:
        size = os.fstat(f.fileno()).st_size
        if self.tail is None or size <= self.tail:
            return
        f.seek(size - self.tail)
        head = f.read(4)
        lead = next((i for i, b in enumerate(head) if b & 0xC0 != 0x80), len(head))
        self.offset = self.skipped = size - self.tail + lead

    def read(self) -> tuple[int, str] | None:
        """(offset of the text, text) of what is new, None when nothing is."""
        try:
            with open(self.path, "rb") as f:
                if self.tail is not None:
                    self._start(f)
                    self.tail = None
                f.seek(self.offset)
                data = f.read(READ_CHUNK)
        except FileNotFoundError:
            return None
        if not data:
            return None
        start = self.offset
        self.offset += len(data)
        return start, self._decoder.decode(data)

    def finish(self) -> str:
        return self._decoder.decode(b"", final=True)


async def api_output(request: web.Request) -> web.StreamResponse:
    with contextlib.suppress(ConnectionResetError):  # the page went away mid-write
        return await _output(request)
    return web.Response()  # never sent: the connection is gone


async def _output(request: web.Request) -> web.StreamResponse:
    hub = request.app[HUB]
    turn_id = _turn_id(request)
    stream = request.query.get("stream", "stdout")
    if stream not in ("stdout", "stderr"):
        raise web.HTTPBadRequest(text="stream is stdout or stderr")
    try:
        tail = int(request.query.get("tail", "")) if "tail" in request.query else None
    except ValueError:
        raise web.HTTPBadRequest(text="tail is a number of bytes") from None
    reader = LogReader(hub.paths.output_log(turn_id, stream), tail)
    waker = asyncio.Event()
    hub.output_wakers.setdefault(turn_id, set()).add(waker)
    try:
        response = await _sse(request)
        while True:
            waker.clear()
            ended = _turn_ended(hub, turn_id)  # judged before the read: nothing can come after
            while (got := await hub.link.run(reader.read)) is not None:
                if reader.skipped and got[0] == reader.skipped:
                    await _send(response, "skipped", {"bytes": reader.skipped})
                await _send(response, "chunk", {"offset": got[0], "text": got[1]})
            if ended:
                rest = reader.finish()
                if rest:
                    await _send(response, "chunk", {"offset": reader.offset, "text": rest})
                missing = not reader.path.exists()  # pruned by [logs], or never written
                await _send(response, "end", {"bytes": reader.offset, "missing": missing})
                return response
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(OUTPUT_IDLE):
                    await waker.wait()
    finally:
        wakers = hub.output_wakers.get(turn_id, set())
        wakers.discard(waker)
        if not wakers:
            hub.output_wakers.pop(turn_id, None)


def _turn_ended(hub: Hub, turn_id: str) -> bool:
    view = hub.live.turn(turn_id)
    return view is None or not view["active"]


async def api_cancel(request: web.Request) -> web.Response:
    hub = request.app[HUB]
    turn_id = _turn_id(request)
    try:
        result = await hub.link.call("cancel", id=turn_id)
    except RemoteError as e:
        return _error(404 if e.code == "not_found" else 409, e.message)
    except NotRunning as e:
        return _error(503, e.message)
    except CcsupError as e:
        return _error(502, e.message)
    log.info("turn %s cancelled from the page (%s)", turn_id, request.remote)
    return _json(result)


def _logged_in(session: str) -> web.Response:
    """To the main page, with the session cookie."""
    response = web.Response(status=303, headers={"Location": "/"})
    response.set_cookie(COOKIE, session, httponly=True, samesite="Strict", path="/")
    return response


async def login_get(request: web.Request) -> web.Response:
    gate = request.app[GATE]
    code = request.query.get("code")
    if code:
        session = gate.use_login_code(code)
        if session is None:
            return _error(403, "that login code is spent or wrong; log in with the token")
        return _logged_in(session)
    return web.Response(text=_page("login.html", ""), content_type="text/html")


async def login_post(request: web.Request) -> web.Response:
    gate = request.app[GATE]
    form = await request.post()
    token = form.get("token")
    session = gate.login_with_token(token) if isinstance(token, str) else None
    if session is None:
        return _error(403, "wrong token")
    return _logged_in(session)


def make_app(hub: Hub, gate: Gate) -> web.Application:
    app = web.Application(middlewares=[access_middleware], client_max_size=64 * 1024)
    app[HUB] = hub
    app[GATE] = gate
    app.router.add_get("/", index)
    app.router.add_get("/turn/{id}", turn_page)
    app.router.add_get("/static/{name}", static)
    app.router.add_get("/api/state", api_state)
    app.router.add_get("/api/events", api_events)
    app.router.add_get("/api/turn/{id}", api_turn)
    app.router.add_get("/api/turn/{id}/output", api_output)
    app.router.add_post("/api/turn/{id}/cancel", api_cancel)
    app.router.add_get("/login", login_get)
    app.router.add_post("/login", login_post)

    async def on_startup(app: web.Application) -> None:
        app[HUB].start()

    async def on_cleanup(app: web.Application) -> None:
        await app[HUB].stop()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app


def _bound_port(runner: web.AppRunner) -> int | None:
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    return None


async def serve(
    state_dir: Path,
    endpoints: Any,
    listen: Listen,
    token: str | None,
    *,
    announce: Callable[[str, Gate], None],
    until: asyncio.Future | None = None,
) -> None:
    """Run the app until `until` completes or the task is cancelled."""
    link = Link(state_dir, endpoints)
    hub = Hub(link, state_dir)
    gate = Gate(listen, listen.port, token)
    app = make_app(hub, gate)
    runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    try:
        site = web.TCPSite(runner, listen.host, listen.port, reuse_address=True)
        try:
            await site.start()
        except OSError as e:
            raise CcsupError(f"unable to listen on {listen}: {e.strerror}") from None
        port = _bound_port(runner) or listen.port
        gate.port = port
        gate.hosts = gate._hosts()
        announce(f"http://{listen.url_host()}:{port}/", gate)
        await (until if until is not None else asyncio.get_running_loop().create_future())
    finally:
        await runner.cleanup()
