"""`ccsup wrap <harness> [ARGS...]`: a whole interactive harness session as one contained turn.

`ccsup run -t --key <[wrap] key> --session <label> --harness <name> -- HARNESS ARGS...` with
nothing said of the turn itself unless it waits for a slot (run's hidden `--quiet-start`): the session gets this terminal (a pty: keys, Ctrl-C, resizes),
this cwd and this environment, and its exit status is the session's; everything the session
starts (MCP servers, background shells, `tmux` servers of agent teams) is contained by the
turn's guard and ended, and named as the turn's leftovers, when the harness exits. Its own
hooked commands and MCP calls stay turns of their own keys: the session's environment carries
`CCSUP_WRAP_SESSION` (its label, which the hook and `ccsup mcp` use as their turns' session) and
`CCSUP_WRAP_KEY`, so `ccsup ps` shows which wrapped session each belongs to.

The label is `<harness>-<8 hex>`, made here (known before the turn exists, so it can be in the
session's environment). The session gets a pty only when stdin and stdout are both terminals;
otherwise stdin is forwarded as a pipe (`-i`) and the output as any turn's, so `echo hi | ccsup
wrap claude -p > out.json` sees a pipe and a file, as `claude -p` would.
"""

from __future__ import annotations

import os
import secrets

import click

from ..agents.harnesses import WRAP_SESSION_ENV
from .options import complete_keys, optional_key_option
from .where import where

SESSION_ENV = WRAP_SESSION_ENV  # the wrapped session's label, for its hook and MCP turns
KEY_ENV = "CCSUP_WRAP_KEY"  # the wrapped session's own key


def session_label(harness: str) -> str:
    name = os.path.basename(harness) or "session"
    return f"{name[:64]}-{secrets.token_hex(4)}"


@click.command(context_settings={"allow_interspersed_args": False})
@click.option(
    "--key",
    callback=optional_key_option,
    shell_complete=complete_keys,
    help="The cap key of the session's turn (default: [wrap] key, `session`).",
)
@click.argument("harness")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def wrap(ctx: click.Context, key: str | None, harness: str, args: tuple[str, ...]) -> None:
    """Run HARNESS (claude, codex, opencode, gemini, qwen, any program) as a contained session.

    The session runs on this terminal, in this directory and environment, as one turn of
    [wrap] key; whatever it leaves running when it exits (MCP servers, background shells) is
    ended and named in the turn's leftovers (`ccsup show`, `ccsup history --leftovers`). Its
    hooked commands and MCP calls run as turns of their own keys, labelled with the session.
    Its exit status is the harness's.

    \b
    Examples:
      ccsup wrap claude
      ccsup wrap codex --model gpt-5
      alias claude='ccsup wrap claude'"""
    from .run.command import run

    settings = where(ctx).config().wrap
    label = session_label(harness)
    tty = os.isatty(0) and os.isatty(1)  # as the harness would see them without ccsup
    ctx.invoke(
        run,
        key=key or settings.key,
        session=label,
        agent=None,
        harness=os.path.basename(harness) or None,
        reservation=None,
        pass_env=False,
        cwd=None,
        env={SESSION_ENV: label, KEY_ENV: key or settings.key},
        clean_env=False,
        wait_timeout=None,
        timeout=None,
        as_json=False,
        interactive=not tty,
        want_tty=tty,
        quiet=False,  # a session that waits for a slot says so, as `ccsup run` does
        quiet_start=True,  # and says nothing else of itself: the screen is the harness's
        cmd=(harness, *args),
    )
