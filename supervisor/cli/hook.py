"""`ccsup hook install|uninstall|run|doctor <harness>`: route an agent's heavy shell commands
through ccsup (supervisor.agents.hook, .install, .doctor), for claude, codex and opencode.

`run` is the hook itself (what the harness calls with its hook JSON on stdin); `install` writes
the fast form of it (`python -S .../fast_hook.py`, which skips click), so `run` is for trying a payload
by hand. Exit codes: 0 (the hook always exits 0: a broken hook never stops an agent), 1 when a
settings file cannot be written or the doctor finds the rewrite did not take effect, 2 usage.
"""

from __future__ import annotations

from pathlib import Path

import click

HARNESS = click.Choice(["claude", "codex", "opencode"])


@click.group()
def hook() -> None:
    """Route an agent harness's heavy shell commands through ccsup turns."""


def _target(value: str | None) -> Path | None:
    return Path(value).expanduser() if value else None


@hook.command()
@click.argument("harness", type=HARNESS)
@click.option(
    "--key",
    help="The cap key of the rewritten commands ([hooks] key, else $CCSUP_KEY, else default).",
)
@click.option(
    "--match",
    multiple=True,
    metavar="PATTERN",
    help="Also route commands this Python regular expression finds (repeatable).",
)
@click.option(
    "--settings",
    metavar="PATH",
    help="The file to write (claude: settings.json, codex: hooks.json; opencode: the plugins folder).",
)
@click.pass_context
def install(
    ctx: click.Context, harness: str, key: str | None, match: tuple[str, ...], settings: str | None
) -> None:
    """Write HARNESS's hook configuration so matching commands run as ccsup turns."""
    import os
    import re

    from ..agents import install as installer
    from ..caps import check_key
    from ..errors import UsageError
    from .where import where

    if key is not None:
        check_key(key)
    for pattern in match:
        try:
            re.compile(pattern)
        except re.error as e:
            raise UsageError(f"--match {pattern!r} is not a regular expression: {e}") from None
    from ..agents.rules import config_path

    found = where(ctx)  # the hook carries the state directory and config found here, absolute
    state_dir = found.state_dir().expanduser().absolute()
    given_config = found.config_option or config_path(os.environ)
    config = Path(given_config).expanduser().absolute() if given_config else None
    sandbox = _sandbox_entries(found) if harness == "claude" else None
    target = _target(settings)
    if harness == "codex":  # config.toml not TOML: refused before hooks.json is written
        from ..agents import codex_sandbox

        codex_sandbox.check((target or installer.default_target(harness)).parent)
    path = installer.install(harness, target, key, match, state_dir, config, sandbox)
    click.echo(f"ccsup: {harness} hook written to {path}")
    if harness == "codex":
        words, sockets = _ccsup_and_sockets(found)
        for line in codex_sandbox.install(path.parent, words, sockets):
            click.echo(f"ccsup: {line}")
    if state_dir is not None or config is not None:
        click.echo(
            f"ccsup: the hook carries {state_dir or 'no state directory'} and {config or 'no config'}"
        )
    if harness == "codex":
        click.echo("ccsup: Codex runs a new hook only once it is trusted: review it with /hooks")


def _sandbox_entries(found) -> dict:
    """Claude Code's sandbox entries for this state directory (agents.install.sandbox_entries)."""
    from ..agents import install as installer

    return installer.sandbox_entries(*_ccsup_and_sockets(found))


def _ccsup_and_sockets(found) -> tuple[list[str], list[str]]:
    """The words the hook's rewrite starts with, found as the hook finds them, and the
    supervisor's control and bus sockets."""
    import os

    from ..agents.route import ccsup_words
    from ..paths import ipc_path

    env = dict(os.environ)
    if found.state_dir_option:
        os.environ["CCSUP_STATE_DIR"] = found.state_dir_option
    if found.config_option:
        os.environ["CCSUP_CONFIG"] = found.config_option
    try:
        words = ccsup_words()
    finally:
        os.environ.clear()
        os.environ.update(env)
    config = found.config()
    state_dir = found.state_dir(config)
    endpoints = config.endpoints.resolve(state_dir)
    sockets = [
        path
        for path in (ipc_path(e) for e in (endpoints.control, endpoints.bus_in, endpoints.bus_out))
        if path is not None
    ]
    return words, sockets


@hook.command()
@click.argument("harness", type=HARNESS)
@click.option("--settings", metavar="PATH", help="The file install wrote (as for install).")
@click.pass_context
def uninstall(ctx: click.Context, harness: str, settings: str | None) -> None:
    """Remove exactly what `ccsup hook install HARNESS` wrote."""
    from ..agents import install as installer
    from .where import where

    sandbox = _sandbox_entries(where(ctx)) if harness == "claude" else None
    if harness == "codex":
        from ..agents import codex_sandbox

        codex_sandbox.check((_target(settings) or installer.default_target(harness)).parent)
    path, removed = installer.uninstall(harness, _target(settings), sandbox)
    if harness == "codex":
        if codex_sandbox.uninstall(path.parent):
            click.echo(
                f"ccsup: Codex's sandbox rule and permission entries removed from {path.parent}"
            )
    click.echo(
        f"ccsup: {harness} hook removed from {path}"
        if removed
        else f"ccsup: no ccsup hook in {path}"
    )


@hook.command(context_settings={"ignore_unknown_options": True})
@click.argument("harness", type=HARNESS)
@click.argument("flags", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def run(ctx: click.Context, harness: str, flags: tuple[str, ...]) -> None:
    """The hook: read HARNESS's hook JSON on stdin, print the answer ([--key K] [--match P]...)."""
    from ..agents.hook import main

    ctx.exit(main([harness, *flags]))


@hook.command()
@click.argument("harness", type=HARNESS)
@click.option(
    "--bin", "executable", metavar="PATH", help="The harness's executable (default: on PATH)."
)
@click.option("--settings", metavar="PATH", help="The file install wrote (as for install).")
@click.option(
    "--harness-arg",
    "extra",
    multiple=True,
    metavar="ARG",
    help="An argument added to the harness's command line (repeatable).",
)
@click.pass_context
def doctor(
    ctx: click.Context,
    harness: str,
    executable: str | None,
    settings: str | None,
    extra: tuple[str, ...],
) -> None:
    """Run a canary through the installed HARNESS and say whether the rewrite took effect."""
    from ..agents.doctor import doctor as run_doctor
    from .where import where

    with where(ctx).client() as client:
        verdict = run_doctor(harness, executable, _target(settings), client, extra)
    for line in verdict.lines:
        click.echo(f"ccsup: {line}")
    ctx.exit(0 if verdict.ok else 1)
