"""ccsup(1), generated from the click commands:

    python -m supervisor.cli.manpage > ~/.local/share/man/man1/ccsup.1 && man ccsup

The page is what `--help` says, in roff: NAME, SYNOPSIS, DESCRIPTION, the global OPTIONS, every
command (grouped as `ccsup --help` groups them) with its usage, text, examples and options, EXIT
STATUS and ENVIRONMENT. No generated copy is kept in the tree, so it cannot drift from the
commands: it is made from the installed ccsup. Pure but for importing every command.
"""

from __future__ import annotations

import click

EXIT_STATUS = (
    ("0", "success"),
    ("1", "failure"),
    ("2", "usage or configuration error (a supervisor's bad_request reply included)"),
    ("3", "no supervisor running on the state directory"),
)
ENVIRONMENT = (
    ("CCSUP_STATE_DIR", "the state directory (as --state-dir)"),
    ("CCSUP_CONFIG", "the configuration file (as --config)"),
    ("CCSUP_KEY", "the cap key of ccsup run without --key"),
    ("NO_COLOR", "no colour in ccsup top and the tables"),
)


def _roff(text: str) -> str:
    """Text escaped for roff: backslashes, and a leading dot or quote."""
    lines = []
    for line in text.replace("\\", "\\e").splitlines():
        if line.startswith((".", "'")):
            line = "\\&" + line
        lines.append(line.replace("-", "\\-"))
    return "\n".join(lines)


def _paragraphs(text: str) -> str:
    out = []
    for block in text.strip().split("\n\n"):
        if block.startswith("\b"):
            out.append(".nf\n" + _roff(block.removeprefix("\b").strip("\n")) + "\n.fi")
        else:
            out.append(_roff(" ".join(line.strip() for line in block.splitlines())))
    return "\n.PP\n".join(out)


def _options(ctx: click.Context, command: click.Command) -> list[str]:
    out = []
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is None:
            continue
        names, text = record
        out.append(f".TP\n.B {_roff(names)}\n{_roff(text)}")
    return out


def _command(parent: click.Context, name: str, command: click.Command, prefix: str) -> list[str]:
    ctx = click.Context(command, info_name=name, parent=parent)
    usage = " ".join(command.collect_usage_pieces(ctx))
    out = [f".SS {_roff(prefix + name)}", f".B {_roff(prefix + name)}\n{_roff(usage)}", ".PP"]
    out.append(_paragraphs(command.help or ""))
    from .help_text import examples_epilog

    examples = examples_epilog(name, command.help) if prefix == "ccsup " else None
    for epilog in (command.epilog, examples):
        if epilog:
            out += [".PP", _paragraphs(epilog)]
    out += _options(ctx, command)
    if isinstance(command, click.Group):
        for sub_name in command.list_commands(ctx):
            sub = command.get_command(ctx, sub_name)
            if sub is not None and not sub.hidden:
                out += _command(ctx, sub_name, sub, prefix + name + " ")
    return out


def render() -> str:
    from .. import __version__
    from . import main
    from .help_text import GROUPS

    ctx = click.Context(main, info_name="ccsup")
    names = main.list_commands(ctx)
    listed = {n for _, group in GROUPS for n in group}
    sections = [*GROUPS, ("Other", tuple(n for n in names if n not in listed))]
    out = [
        f'.TH CCSUP 1 "" "ccsup {__version__}" "User Commands"',
        ".SH NAME",
        "ccsup \\- a machine\\-wide supervisor for capped, contained work",
        ".SH SYNOPSIS",
        ".B ccsup\n[\\fIOPTIONS\\fR] \\fICOMMAND\\fR [\\fIARGS\\fR]...",
        ".SH DESCRIPTION",
        _paragraphs(main.help or ""),
        ".SH OPTIONS",
        *_options(ctx, main),
    ]
    for title, group in sections:
        commands = [(n, main.get_command(ctx, n)) for n in group if n in names]
        if not commands:
            continue
        out.append(f'.SH "{title.upper()}"')
        for name, command in commands:
            if command is not None and not command.hidden:
                out += _command(ctx, name, command, "ccsup ")
    out.append('.SH "EXIT STATUS"')
    out += [f".TP\n.B {code}\n{_roff(text)}" for code, text in EXIT_STATUS]
    out.append(".SH ENVIRONMENT")
    out += [f".TP\n.B {name}\n{_roff(text)}" for name, text in ENVIRONMENT]
    out += ['.SH "SEE ALSO"', "The README and docs/ of ccsup's source tree."]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(render(), end="")
