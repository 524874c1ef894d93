"""Help for people: `ccsup --help` lists the commands in groups, every
command's `--help` shows an example, and the man page made from the click commands covers every
command and renders."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from click.testing import CliRunner

from supervisor.cli import COMMANDS, main
from supervisor.cli.help_text import GROUPS
from supervisor.cli.manpage import render


def test_the_top_help_lists_every_command_once_in_its_group():
    shown = CliRunner().invoke(main, ["--help"]).output
    for title, _ in GROUPS:
        assert f"\n{title}:\n" in shown
    listed = [
        line.split()[0] for line in shown.splitlines() if line.startswith("  ") and line.split()
    ]
    for name in COMMANDS:
        assert listed.count(name) == 1, (name, shown)
    assert "Other:" not in shown  # every command has a group


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_help_shows_an_example(name):
    shown = CliRunner().invoke(main, [name, "--help"])
    assert shown.exit_code == 0, shown.output
    examples = shown.output.split("Example", 1)
    assert len(examples) == 2, shown.output
    assert "ccsup " in examples[1]  # an example is a command line


def test_the_man_page_has_every_command_and_renders():
    page = render()
    for name in COMMANDS:
        assert f".SS ccsup {name}\n" in page
    assert '.SH "EXIT STATUS"' in page
    if shutil.which("man") is None or shutil.which("groff") is None:
        pytest.skip("man/groff are not installed: the page is not rendered")
    done = subprocess.run(
        ["man", "--warnings", "-l", "-"], input=page, capture_output=True, text=True,
        env={"MANWIDTH": "80", "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "CCSUP(1)" in done.stdout and "ccsup stop" in done.stdout
    assert done.stderr == "", done.stderr


def test_the_documented_install_step_makes_man_ccsup_work(tmp_path):
    """`python -m supervisor.cli.manpage --install` into a prefix whose bin is on the PATH (a
    venv's, as the README sets it up): `man ccsup` then finds the page with no MANPATH, and each
    example is a line of its own, not one run-together paragraph."""
    if shutil.which("man") is None or shutil.which("groff") is None:
        pytest.skip("man/groff are not installed")
    from supervisor.cli.manpage import install

    prefix = tmp_path / "venv"
    (prefix / "bin").mkdir(parents=True)
    env = {"PATH": f"{prefix / 'bin'}:/usr/bin:/bin", "MANWIDTH": "100", "LANG": "C.UTF-8"}
    old = dict(os.environ)
    os.environ["PATH"] = env["PATH"]
    try:
        said = install(str(prefix))
    finally:
        os.environ.clear()
        os.environ.update(old)
    assert said == f"wrote {prefix}/share/man/man1/ccsup.1: man ccsup"
    shown = subprocess.run(
        ["man", "ccsup"], capture_output=True, text=True, env=env, timeout=60
    ).stdout
    lines = [line.strip() for line in shown.splitlines()]
    assert "ccsup config check" in lines  # an example alone on its line
    assert "ccsup cancel 3f2a9c01" in " ".join(lines)
