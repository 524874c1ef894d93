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
  POST /api/key/<key>/pause       pause a key ({"for": "10m"}), reason "paused from the page"
  POST /api/key/<key>/resume      end a key's pause
  GET  /login?code=<one-time>     set the session cookie; POST /login (token=...) likewise

The app is a client of the supervisor: what the page shows lives in the Hub (supervisor.web.hub:
the live model, its refresher and the open streams' queues); a turn's output is read from its log
file by LogReader (supervisor.web.log_reader) in a worker thread. This module turns both into
HTTP: pages, JSON, server-sent events (a keep-alive every 15 s; a stream the Hub drops ends, and
the page's EventSource reconnects), and the cancel call.

Knows HTTP and the page's routes; the supervisor only through the Hub's Link, who may do what
through supervisor.web.access; nothing of how the model is kept fresh or how a log is decoded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import weakref
from collections.abc import Awaitable, Callable
from importlib import resources
from pathlib import Path
from typing import Any

from aiohttp import web

from ..client.control import RemoteError
from ..config.web import Listen
from ..errors import CcsupError, NotRunning
from ..paths import TURN_ID
from .access import ALLOWED, COOKIE, CSRF_HEADER, Gate, Verdict
from .hub import Hub
from .link import Link
from .log_reader import LogReader

log = logging.getLogger("ccsup.web")

OUTPUT_IDLE = 1.0  # seconds an output stream waits for a bus hint before it looks at the file

STATIC = ("app.js", "turn.js", "common.js", "style.css")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

HUB = web.AppKey("hub", Hub)
GATE = web.AppKey("gate", Gate)
# Each open connection's access verdict (rule 0), gone with the connection.
PEERS = web.AppKey("peers", weakref.WeakKeyDictionary)


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
    verdict = await _peer_verdict(request)
    if verdict.status == 0:
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


async def _peer_verdict(request: web.Request) -> Verdict:
    """Whose the connection is (access rule 0), once per connection: the kernel's socket table
    takes ~7-9 ms to read here, so in a worker thread, and kept while the connection lives."""
    gate = request.app[GATE]
    if gate.token is not None:
        return ALLOWED
    transport = request.transport
    if transport is None:
        return gate.check_peer(None, None)
    peers = request.app[PEERS]
    verdict: Verdict | None = peers.get(transport)
    if verdict is None:
        local, peer = transport.get_extra_info("sockname"), transport.get_extra_info("peername")
        verdict = await asyncio.to_thread(gate.check_peer, local, peer)
        peers[transport] = verdict
    return verdict


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


async def api_key_pause(request: web.Request) -> web.Response:
    """Pause a key from the page: `{"for": "10m"}` (a duration), through the control socket."""
    return await _key_call(request, "pause")


async def api_key_resume(request: web.Request) -> web.Response:
    return await _key_call(request, "resume")


async def _key_call(request: web.Request, action: str) -> web.Response:
    from ..caps import check_key
    from ..config.values import duration

    hub = request.app[HUB]
    try:
        key = check_key(request.match_info["key"])
        args: dict[str, object] = {"key": key}
        if action == "pause":
            body = await request.json() if request.can_read_body else {}
            span = body.get("for", "10m") if isinstance(body, dict) else None
            if not isinstance(span, str):
                return _error(400, 'give the pause\'s length as {"for": "10m"}')
            args["for"] = duration(span, where="for")
            args["reason"] = "paused from the page"
    except ValueError:
        return _error(400, "the body is not JSON")
    except CcsupError as e:
        return _error(400, e.message)
    try:
        result = await hub.link.call(action, **args)
    except RemoteError as e:
        return _error(400 if e.code == "bad_request" else 409, e.message)
    except NotRunning as e:
        return _error(503, e.message)
    except CcsupError as e:
        return _error(502, e.message)
    log.info("key %s: %s from the page (%s)", key, action, request.remote)
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
    app[PEERS] = weakref.WeakKeyDictionary()
    app.router.add_get("/", index)
    app.router.add_get("/turn/{id}", turn_page)
    app.router.add_get("/static/{name}", static)
    app.router.add_get("/api/state", api_state)
    app.router.add_get("/api/events", api_events)
    app.router.add_get("/api/turn/{id}", api_turn)
    app.router.add_get("/api/turn/{id}/output", api_output)
    app.router.add_post("/api/turn/{id}/cancel", api_cancel)
    app.router.add_post("/api/key/{key}/pause", api_key_pause)
    app.router.add_post("/api/key/{key}/resume", api_key_resume)
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
