"""ccsup(1), generated from the click commands:

    python -m supervisor.cli.manpage --install && man ccsup

`--install` writes the page to `<prefix>/share/man/man1/ccsup.1`, beside ccsup's own `bin`
(the venv's, for a venv): man-db looks in `X/share/man` for every `X/bin` on the PATH, so with
the venv's bin on the PATH (as the README's set-up has it) `man ccsup` finds it with no MANPATH.
It says where it wrote, and what to do when that bin is not on the PATH. Without `--install`
the page goes to stdout.

The page is what `--help` says, in roff: NAME, SYNOPSIS, DESCRIPTION, the global OPTIONS, every
command (grouped as `ccsup --help` groups them) with its usage, text, examples and options, EXIT
STATUS and ENVIRONMENT. No generated copy is kept in the tree, so it cannot drift from the
commands: it is made from the installed ccsup. Pure but for importing every command.
"""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

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
    if command.epilog:
        out += [".PP", _paragraphs(command.epilog)]
    if examples:  # a line each, as --help shows them (filled, they ran into one paragraph)
        title, _, body = examples.removeprefix("\b\n").partition("\n")
        out += [".PP", _roff(title), ".nf", ".RS 4", _roff(textwrap.dedent(body)), ".RE", ".fi"]
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


def install(prefix: str = sys.prefix) -> str:
    """Write the page where `man` finds it for this ccsup; what to tell the user."""
    target = Path(prefix) / "share" / "man" / "man1" / "ccsup.1"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render(), encoding="utf-8")
    bin_dir = os.path.realpath(Path(prefix) / "bin")
    on_path = any(
        os.path.realpath(d) == bin_dir for d in os.environ.get("PATH", "").split(os.pathsep) if d
    )
    if on_path:
        return f"wrote {target}: man ccsup"
    return (
        f"wrote {target}; {bin_dir} is not on PATH, so man will not look there: "
        f"MANPATH={target.parent.parent}: man ccsup"
    )


if __name__ == "__main__":
    if sys.argv[1:] == ["--install"]:
        print(install())
    elif sys.argv[1:]:
        sys.exit("usage: python -m supervisor.cli.manpage [--install]")
    else:
        print(render(), end="")
