"""`ccsup mcp`: an MCP server over stdio (the official `mcp` SDK, the extra `ccsup[mcp]`) whose tools
queue commands as ccsup turns: run, wait, reserve, status, ps, why, logs, cancel.

Design note. Every call answers within BOUND seconds (25; `$CCSUP_MCP_BOUND` for tests), because a
harness gives an MCP call 60 s unless it sends a progress token, and OpenCode never does: a turn
still waiting or running then answers with its id, state and queue position, and `wait` resumes
it by id. While a call waits, a progress notification goes out every PROGRESS seconds (5;
`$CCSUP_MCP_PROGRESS`) when the client sent a progress token (the SDK sends none otherwise).

The turn's requester is the harness (this server's parent, pid + start ticks), not this server:
a client that reconnects starts a new server, and the turn it asked for must outlive the old one
(`wait` picks it up), while a harness that ends takes its turns with it, as for `ccsup run`. The
turn gets this server's environment (the harness's: PATH, virtualenvs, keys), which the supervisor
keeps out of records, events and history.

The session label: the first of the harness's variables that is set (SESSION_ENV), else the MCP
client's name and the harness's pid. The blocking client runs in a worker thread per call (a
Client per call: it is not thread-safe); progress goes back to the event loop from there.

State: none of its own. Bad arguments (a wrong type, a missing key, an unknown id) are refused
before anything is asked of the supervisor: nothing runs, nothing is cancelled.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from typing import Annotated, Any

import anyio
import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from .. import __version__
from ..caps import key_problem
from ..errors import CcsupError, UnknownTurn, UsageError
from ..paths import TURN_ID
from ..wire import protocol
from ..wire.args import MAX_TIMEOUT
from . import turns
from .harnesses import WRAP_SESSION_ENV

BOUND_ENV = "CCSUP_MCP_BOUND"
PROGRESS_ENV = "CCSUP_MCP_PROGRESS"
DEFAULT_BOUND = 25.0
DEFAULT_PROGRESS = 5.0
LOG_LIMIT = 65536  # bytes one `logs` call returns at most
MAX_OFFSET = 2**53  # a `logs` offset past it is refused (a log is never that long; JSON-safe)
ANSWER_MARGIN = 5.0  # seconds of the bound kept for taking the call in, its last look, its answer
WORKERS = 16  # threads for the short blocking calls (never one per waiting call)
MAX_SOCKETS = 65536  # of the shared zmq Context: two a call in flight (its SUB and DEALER)
# (variable, harness) in the order they are tried for the session label.
SESSION_ENV = (
    (WRAP_SESSION_ENV, None),  # set by `ccsup wrap`: the wrapped session's label
    ("CLAUDE_CODE_SESSION_ID", "claude"),
    ("CLAUDE_SESSION_ID", "claude"),
    ("CODEX_THREAD_ID", "codex"),
    ("OPENCODE_SESSION_ID", "opencode"),
    ("CCSUP_SESSION", None),
)

INSTRUCTIONS = """\
ccsup runs heavy commands (test suites, builds, package installs, docker, other agents) as turns
under a machine-wide cap, so that many agent sessions on one machine do not run them all at once.
Use `run` for such commands instead of your shell. When the machine is busy the command is queued,
never refused: you get its id and queue position; call `wait` with that id (as often as needed)
until it has ended. Never give up on work, or skip it, because the machine is busy: queue it and
wait. Every call answers within 25 seconds."""


def _seconds(env: str, default: float) -> float:
    text = os.environ.get(env)
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"${env}: {text!r} is not a number of seconds") from None
    if not 0 < value <= 3600:
        raise UsageError(f"${env}: {value:g} must be above 0 and at most 3600 seconds")
    return value


class Settings:
    """What a server needs, resolved once at start: the state directory, endpoints, bounds, how
    long a `wait` waits for a supervisor that is down (`down_wait`: adopt_within + 5 s), and the
    zmq Context every call's client shares (one I/O thread)."""

    def __init__(self, state_dir, endpoints=None, *, down_wait: float = 0.0):
        import zmq

        self.state_dir = state_dir
        self.endpoints = endpoints
        self.bound = _seconds(BOUND_ENV, DEFAULT_BOUND)
        self.progress = _seconds(PROGRESS_ENV, DEFAULT_PROGRESS)
        self.down_wait = down_wait
        # A call waits this much less than the bound: its last look (where the turn stands)
        # and its answer fit in what is left, however many calls answer at once.
        self.answer_margin = min(ANSWER_MARGIN, self.bound / 5)
        self.context = zmq.Context()
        self.context.max_sockets = MAX_SOCKETS

    def client(self):
        from ..client.control import Client

        return Client(self.state_dir, endpoints=self.endpoints, context=self.context)


def requester() -> dict[str, Any]:
    """The harness (this server's parent) as the turn's requester; none when orphaned."""
    from guardd.procs import start_ticks

    parent = os.getppid()
    start = start_ticks(parent) if parent > 1 else None
    return {"pid": parent, "start": start} if start is not None else {}


def holder_labels(client_name: str | None) -> dict[str, str]:
    for name, harness in SESSION_ENV:
        if os.environ.get(name):
            labels = {"session": os.environ[name]}
            if harness:
                labels["harness"] = harness
            return labels
    name = client_name or "mcp"
    return {"session": f"{name}:{os.getppid()}", "harness": name}


def _client_name(ctx: Context) -> str | None:
    try:
        params = ctx.session.client_params
    except (AttributeError, ValueError):
        return None
    info = getattr(params, "client_info", None) if params is not None else None
    return getattr(info, "name", None)


def _progress_token(ctx: Context) -> object:
    """The call's progress token (None: the client asked for no progress notifications)."""
    try:
        meta = ctx.request_context.meta
    except (AttributeError, ValueError):
        return True  # not known: send them (the session drops them without a token)
    if isinstance(meta, dict):
        return meta.get("progress_token") or meta.get("progressToken")
    return getattr(meta, "progress_token", True) if meta is not None else None


def _check_key(key: str) -> str:
    problem = key_problem(key)
    if problem:
        raise ToolError(f"bad key {key[:140]!r}: {problem}")
    return key


def _check_id(turn_id: str) -> str:
    if not TURN_ID.match(turn_id):
        raise ToolError(f"bad id {turn_id[:140]!r}: an id is 1 to 128 letters, digits, '_' or '-'")
    return turn_id


def _answer(view: turns.TurnView, bound: float) -> dict[str, Any]:
    answer: dict[str, Any] = dict(view)
    if view["state"] == "ended":
        answer["next"] = "done: the turn has ended; read more output with `logs`"
    else:
        where = f" at position {view['position']}" if view.get("position") is not None else ""
        answer["next"] = (
            f"still {view['state']}{where} after {bound:g} s; call `wait` with id {view['id']!r} "
            "to keep waiting (never run the command again)"
        )
    return answer


def build(settings: Settings) -> MCPServer:
    server: MCPServer = MCPServer(
        name="ccsup", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING"
    )

    # The short blocking calls have a pool of their own: the SDK reads stdin through anyio's
    # default pool, and a call must never wait behind our work to be read at all.
    limiter = anyio.CapacityLimiter(WORKERS)
    recent_ps = turns.RecentPs(settings.client)

    async def offload(work: Callable[[], Any]) -> Any:
        return await anyio.to_thread.run_sync(work, limiter=limiter)

    async def blocking(work: Callable[[], Any]) -> Any:
        """A short blocking call (a control request, a history read) in a worker thread; a
        ccsup error becomes the tool's error."""
        try:
            return await offload(work)
        except CcsupError as e:
            raise ToolError(e.message) from None

    def progress(ctx: Context):
        """on_tick for turns.follow: a progress notification, when the client asked for them."""
        if not _progress_token(ctx):
            return None

        async def on_tick(elapsed: float, view: turns.TurnView | None) -> None:
            state = view["state"] if view else "unknown"
            where = f", position {view['position']}" if view and view.get("position") else ""
            await ctx.report_progress(elapsed, None, f"{state}{where} after {elapsed:.0f} s")

        return on_tick

    async def followed(ctx: Context, turn_id: str, request=None) -> dict[str, Any]:
        """The turn followed within the bound, on the event loop (no thread while it waits)."""
        client = settings.client()
        try:
            view = await turns.follow(
                client,
                turn_id,
                settings.bound - settings.answer_margin,
                request=None if request is None else lambda: request(client),
                tick=settings.progress,
                on_tick=progress(ctx),
                down_wait=settings.down_wait,
                offload=offload,
                ps_of=recent_ps,
            )
        except CcsupError as e:
            raise ToolError(e.message) from None
        finally:
            client.close()
        return _answer(view, settings.bound)

    @server.tool(
        description=(
            "Run a heavy command (tests, builds, package installs, docker, another agent) as a "
            "ccsup turn under the machine-wide cap of `key`. Give `command` (a shell command "
            "line) or `argv`. Answers within 25 s: the exit code and the tail of the output when "
            "it has ended, else its id, state and queue position; then call `wait` with the id. "
            "A busy machine queues the command, never refuses it: do not skip or refuse work "
            "because of it, queue it and wait."
        )
    )
    async def run(
        ctx: Context,
        command: Annotated[
            str | None, Field(description="A shell command line (run by sh -c).")
        ] = None,
        argv: Annotated[
            list[str] | None, Field(description="The command as a list of words.")
        ] = None,
        key: Annotated[
            str | None, Field(description="The cap key ($CCSUP_KEY, else default).")
        ] = None,
        cwd: Annotated[
            str | None, Field(description="Working directory (default: the server's).")
        ] = None,
        timeout: Annotated[
            float | None,
            Field(
                description="Stop it after it ran this many seconds.",
                gt=0,
                le=MAX_TIMEOUT,
                allow_inf_nan=False,
            ),
        ] = None,
    ) -> dict[str, Any]:
        if (command is None) == (argv is None):
            raise ToolError("give exactly one of `command` (a shell command line) or `argv`")
        if argv is not None and (not argv or not all(isinstance(a, str) for a in argv)):
            raise ToolError("`argv` must be a non-empty list of strings")
        if command is not None and not command.strip():
            raise ToolError("`command` is empty")
        words = ["sh", "-c", command] if command is not None else list(argv or [])
        the_key = _check_key(key or os.environ.get("CCSUP_KEY") or "default")
        where = os.path.abspath(cwd or os.getcwd())
        if not os.path.isdir(where):
            raise ToolError(f"`cwd` {where!r} is not a directory")
        holder = {**holder_labels(_client_name(ctx)), **requester()}
        turn_id = uuid.uuid4().hex
        return await followed(
            ctx,
            turn_id,
            lambda client: client.turn_limited(
                the_key,
                words,
                timeout=timeout,
                id=turn_id,
                cwd=where,
                env=protocol.passed_env(),
                holder=holder,
            ),
        )

    @server.tool(
        description=(
            "Wait for a turn that `run` queued or started, by its id. Answers within 25 s with "
            "its end (exit code, output tail) or where it stands; call again until it has ended. "
            "It never runs anything twice."
        )
    )
    async def wait(
        ctx: Context, id: Annotated[str, Field(description="The turn's id.")]
    ) -> dict[str, Any]:
        return await followed(ctx, _check_id(id))

    @server.tool(
        description=(
            "Hold a slot of `key` for this session before starting heavy work. Free: held for "
            "the reservation's time to live, `run now`. Full: queued, woken oldest first. One "
            "hold per session and key: asking again returns the same one."
        )
    )
    async def reserve(
        ctx: Context, key: Annotated[str | None, Field(description="The cap key.")] = None
    ) -> dict[str, Any]:
        the_key = _check_key(key or os.environ.get("CCSUP_KEY") or "default")
        holder = holder_labels(_client_name(ctx))

        def work():
            with settings.client() as client:
                answer = client.reserve(the_key, holder=holder)
            answer["next"] = (
                "run now"
                if answer.get("state") == "held"
                else f"queued at position {answer.get('position')}: ask again later to see it held"
            )
            return answer

        return await blocking(work)

    @server.tool(description="The supervisor's status: version, turns running and waiting.")
    async def status(ctx: Context) -> dict[str, Any]:
        def work():
            with settings.client() as client:
                return client.status()

        return await blocking(work)

    @server.tool(
        description="Every slot of every key (state, turn, holder) and the waiters in order."
    )
    async def ps(ctx: Context) -> dict[str, Any]:
        def work():
            with settings.client() as client:
                return client.ps()

        return await blocking(work)

    @server.tool(
        description=(
            "Why a turn waits: its key's cap is full, the key is paused, a rate window, fairness "
            "(older waiters first), the machine cap or the memory floor."
        )
    )
    async def why(
        ctx: Context, id: Annotated[str, Field(description="The turn's id.")]
    ) -> dict[str, Any]:
        turn_id = _check_id(id)

        def work():
            with settings.client() as client:
                for wait in client.ps().get("waits", []):
                    if wait.get("id") == turn_id:
                        return {
                            "id": turn_id,
                            "state": "queued",
                            "position": wait.get("position"),
                            "why": wait.get("why"),
                        }
                view = turns.current(client, turn_id)
            if view is None:
                raise UnknownTurn(turn_id, client.state_dir)
            return {"id": turn_id, "state": view["state"], "why": None}

        return await blocking(work)

    @server.tool(
        description=(
            f"A turn's output by byte offset: up to `limit` bytes (at most {LOG_LIMIT}) of stdout "
            "or stderr from `offset`; `next_offset` is where to go on."
        )
    )
    async def logs(
        ctx: Context,
        id: Annotated[str, Field(description="The turn's id.")],
        stream: Annotated[str, Field(description="stdout or stderr.")] = "stdout",
        offset: Annotated[
            int, Field(ge=0, le=MAX_OFFSET, description="The byte to start from.")
        ] = 0,
        limit: Annotated[
            int, Field(gt=0, le=LOG_LIMIT, description="How many bytes at most.")
        ] = 16384,
    ) -> dict[str, Any]:
        turn_id = _check_id(id)
        if stream not in ("stdout", "stderr"):
            raise ToolError(f"bad stream {stream[:40]!r}: stdout or stderr")

        def work():
            with settings.client() as client:
                if turns.current(client, turn_id) is None:
                    raise UnknownTurn(turn_id, client.state_dir)
                path = client.paths.output_log(turn_id, stream)
                size = path.stat().st_size if path.exists() else 0
                data = (
                    client.read_log(turn_id, stream, offset, offset + limit)
                    if path.exists()
                    else b""
                )
            return {
                "id": turn_id,
                "stream": stream,
                "offset": offset,
                "next_offset": offset + len(data),
                "size": size,
                "data": data.decode("utf-8", "replace"),
                "path": str(path),
            }

        return await blocking(work)

    @server.tool(
        description="Cancel a turn by id: a queued one takes nothing, a running one is stopped."
    )
    async def cancel(
        ctx: Context, id: Annotated[str, Field(description="The turn's id.")]
    ) -> dict[str, Any]:
        turn_id = _check_id(id)

        def work():
            with settings.client() as client:
                if turns.current(client, turn_id) is None:
                    raise UnknownTurn(turn_id, client.state_dir)
                return client.cancel(turn_id)

        return await blocking(work)

    return server


def serve(settings: Settings) -> None:
    build(settings).run("stdio")
