"""`ccsup web [--listen HOST:PORT]`: serve the live page, a client of the running supervisor.

The listen address comes from --listen, else `[web] listen`, else 127.0.0.1:8765; the token only
from `[web] token` (a secret belongs in a 0600 file, not in argv where `ps` shows it). A listen
that is not loopback without a token is refused before anything binds (exit 2).

It prints one line `ccsup web: serving <url>` once it listens (port 0 prints the port the system
chose), and with a token a second one, `ccsup web: log in once at <url>/login?code=...` (that
code works once; later logins use the token in the login form, or a bearer token).

`--exit-with-parent` (hidden) is how the daemon runs it beside itself for `[web] listen`: the
app ends when its parent, the supervisor, is gone, even by SIGKILL (a pidfd on the parent).
SIGTERM and SIGINT end it cleanly.
"""

from __future__ import annotations

import os
import signal
import sys

import click

from .where import where


@click.command("web")
@click.option(
    "--listen",
    metavar="HOST:PORT",
    help="Where to serve the page (default: [web] listen, else 127.0.0.1:8765).",
)
@click.option("--exit-with-parent", is_flag=True, hidden=True)
@click.pass_context
def web(ctx: click.Context, listen: str | None, exit_with_parent: bool) -> None:
    """Serve a live page of keys, holders, the queue and recent turns.

    The page shows each key's slots and holders, the queue with why each waiter waits, a
    timeline of recent turns and any turn's output, and can cancel a turn and pause or resume a
    key. It is a client of the running supervisor: start one first (`ccsup start`); when the
    supervisor stops, the page says "not connected" and waits for the next one.

    It listens on 127.0.0.1 unless told otherwise. A listen address that is not loopback needs
    `[web] token` in the config (refused before anything binds, exit 2); with a token, the
    second line printed is a one-time login link. Ctrl-C (or SIGTERM) stops it. `[web] listen`
    in the config makes the supervisor serve the page itself, beside it, for its whole life."""
    import asyncio

    from ..config.web import DEFAULT_LISTEN, check_exposure, parse_listen

    config = where(ctx).config()
    state_dir = where(ctx).state_dir(config)
    token = config.web.token
    if listen is not None:
        address = parse_listen(listen, where="--listen")
    elif config.web.listen is not None:
        address = config.web.listen
    else:
        address = parse_listen(DEFAULT_LISTEN, where="--listen")
    check_exposure(address, token, where="--listen" if listen else "web.listen")
    endpoints = config.endpoints.resolve(state_dir)

    from ..web.app import serve

    def announce(url: str, gate) -> None:
        click.echo(f"ccsup web: serving {url} (supervisor on {state_dir})")
        if gate.login_code is not None:
            click.echo(f"ccsup web: log in once at {url}login?code={gate.login_code}")
        sys.stdout.flush()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def finish() -> None:
            if not done.done():
                done.set_result(None)

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, finish)
        if exit_with_parent:
            _watch_parent(loop, finish)
        await serve(state_dir, endpoints, address, token, announce=announce, until=done)

    asyncio.run(main())


def _watch_parent(loop, finish) -> None:
    """Call finish when the parent process ends (already gone: at once)."""
    parent = os.getppid()
    try:
        fd = os.pidfd_open(parent)
    except OSError:
        loop.call_soon(finish)
        return
    if os.getppid() != parent:  # it ended between the two calls
        loop.call_soon(finish)

    def gone() -> None:
        loop.remove_reader(fd)
        os.close(fd)
        finish()

    loop.add_reader(fd, gone)
