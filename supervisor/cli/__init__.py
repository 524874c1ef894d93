"""`ccsup`: the command line. Each command is a thin shell over supervisor.client.

Exit codes: 0 ok, 1 failure, 2 usage or configuration (click's own usage errors and ccsup's
UsageError family, a supervisor's `bad_request` reply included), 3 no supervisor running on the
state directory. `ccsup run` exits with its command's status instead (128+N for a signal), 125
when the turn's guard was lost, and supervisor.cli.run.exits's codes (124, 75, 130, 69, 65). Only CcsupError is
caught at the top ("ccsup: <message>" on stderr, its `exit_code`); anything else is a bug and
shows its traceback.

State: the CLI keeps none. `ccsup start` (without --foreground) re-executes itself as a detached
`python -m supervisor ... start --foreground --log-to-file`, whose stderr goes to
<state>/ccsup.stderr (truncated at each start, so a crash after start-up stays readable), and
returns once the new supervisor answers `status`, or reports the child's stderr and exit code if
it ends first. Run again on a running state directory, it exits 1 saying so. `ccsup run` dying
(even by SIGKILL) leaves nothing: it names itself (pid + start ticks) as the holder, and the
supervisor cancels the turn of a holder that is gone.

Start-up cost: every command pays for what this package's `__init__` imports, so it imports only
click, the errors and `where` (the global options). Each command lives in a module of its own,
imported only when that command runs or its help is shown (`LazyGroup`); in it, the config is
imported by the commands that need a state directory, the client (and with it zmq and the
protocol) by those that talk to the supervisor, subprocess by `start`. `ccsup --version` imports
no command. The daemon side (daemon, manager, asyncio) is only ever imported by
`start --foreground`.

Adding a command: a module `supervisor/cli/<name>.py` with a click command (using
`where(ctx)` for the state directory, the config and a client, and `emit_json` for --json), and
one line in COMMANDS below.
"""

from __future__ import annotations

import importlib

import click

from .. import __version__
from ..errors import CcsupError
from .where import Where

# Every command: its name -> (module in supervisor.cli, the click command's attribute there).
COMMANDS: dict[str, tuple[str, str]] = {
    "start": ("start", "start"),
    "stop": ("stop", "stop"),
    "restart": ("restart", "restart"),
    "status": ("status", "status"),
    "ps": ("ps", "ps"),
    "run": ("run.command", "run"),
    "cancel": ("cancel", "cancel"),
    "events": ("events", "events"),
    "logs": ("logs", "logs"),
    "reap": ("reap", "reap"),
    "reload": ("reload", "reload"),
    "config": ("config", "config_group"),
    "web": ("web", "web"),
    "history": ("history", "history"),
    "show": ("show", "show"),
    "metrics": ("metrics", "metrics"),
    "pause": ("pause", "pause"),
    "resume": ("resume", "resume"),
    "quota": ("quota", "quota"),
    "top": ("top", "top"),
    "mcp": ("mcp", "mcp"),
    "hook": ("hook", "hook"),
    "wait": ("wait", "wait"),
    "wrap": ("wrap", "wrap"),
    "version": ("version", "version"),
}


class LazyGroup(click.Group):
    """The `ccsup` group: commands listed from COMMANDS and imported only when looked up (to run
    them or show their help); a CcsupError from any command becomes a message and its exit code."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *COMMANDS})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in COMMANDS and name not in self.commands:
            module, attribute = COMMANDS[name]
            command = getattr(importlib.import_module(f"{__name__}.{module}"), attribute)
            _take_global_options(command)
            _add_examples(command, name)
            self.add_command(command, name)
        return super().get_command(ctx, name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands in the groups of help_text.GROUPS (the rest under "Other")."""
        from .help_text import GROUPS

        listed = {name for _, names in GROUPS for name in names}
        sections = [
            *GROUPS,
            ("Other", tuple(n for n in self.list_commands(ctx) if n not in listed)),
        ]
        limit = formatter.width - 6 - max(len(n) for n in self.list_commands(ctx))
        for title, names in sections:
            rows = []
            for name in names:
                command = self.get_command(ctx, name) if name in self.list_commands(ctx) else None
                if command is not None and not command.hidden:
                    rows.append((name, command.get_short_help_str(limit)))
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except CcsupError as e:
            if e.message:
                click.echo(f"{_error_prefix()} {e.message}", err=True)
            ctx.exit(e.exit_code)


def _set_global(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value is not None:  # given after the subcommand: it wins over one given before
        found = ctx.find_object(Where)
        if found is not None:
            found.set_option(str(param.name), value)


def _error_prefix() -> str:
    """`ccsup:` before an error, in red on a terminal (supervisor.cli.views.colour's rule)."""
    import sys

    from .views.colour import enabled

    return click.style("ccsup:", fg="red", bold=True) if enabled(sys.stderr) else "ccsup:"


def _add_examples(command: click.Command, name: str) -> None:
    """Examples under the command's help (supervisor.cli.help_text), imported only when the help
    is shown: a command that runs pays nothing for them."""
    own = command.format_epilog

    def format_epilog(ctx: click.Context, formatter: click.HelpFormatter) -> None:
        from .help_text import examples_epilog

        own(ctx, formatter)
        epilog = examples_epilog(name, command.help)
        if epilog is not None:
            formatter.write_paragraph()
            with formatter.indentation():
                formatter.write_text(epilog)

    command.format_epilog = format_epilog  # type: ignore[method-assign]


def _take_global_options(command: click.Command) -> None:
    """Let --state-dir and --config come after the subcommand too (`ccsup ps --state-dir X`),
    on every command of a group as well (`ccsup config check --config F`)."""
    names = {name for p in command.params for name in p.opts}
    for flag, metavar, text in (
        ("--state-dir", "DIR", "The state directory (as `ccsup --state-dir`)."),
        ("--config", "FILE", "The TOML config (as `ccsup --config`)."),
    ):
        if flag not in names:
            command.params.append(
                click.Option(
                    [flag],
                    metavar=metavar,
                    help=text,
                    expose_value=False,
                    is_eager=True,
                    callback=_set_global,
                )
            )
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _take_global_options(sub)


DOCS_EPILOG = (
    "Docs: README.md (the contract: exit codes, decisions, limits) and docs/ (configuration,"
    " admission, cluster, logs, web, sidecars, protocol, containment, design, performance) in"
    " ccsup's source tree."
)


@click.group(
    cls=LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog=DOCS_EPILOG,
    invoke_without_command=True,
)
@click.version_option(
    __version__, "-V", "--version", prog_name="ccsup", message="%(prog)s %(version)s"
)
@click.option(
    "--state-dir",
    envvar="CCSUP_STATE_DIR",
    metavar="DIR",
    help="The supervisor's state directory (also $CCSUP_STATE_DIR; default from the config, "
    "else $XDG_STATE_HOME/ccsup).",
)
@click.option(
    "--config",
    envvar="CCSUP_CONFIG",
    metavar="FILE",
    help="The TOML config (also $CCSUP_CONFIG; default $XDG_CONFIG_HOME/ccsup/ccsup.toml, else built-in).",
)
@click.pass_context
def main(ctx: click.Context, state_dir: str | None, config: str | None) -> None:
    """ccsup: a machine-wide supervisor for capped, contained work."""
    ctx.obj = Where(state_dir, config)
    if ctx.invoked_subcommand is None:  # bare `ccsup`: the help, as docker and kubectl give it
        click.echo(ctx.get_help())
        ctx.exit(0)
