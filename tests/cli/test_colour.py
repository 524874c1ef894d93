"""Colour at a terminal: state words in ps, outcomes in history and the
`ccsup:` of an error are coloured when stdout (stderr) is a terminal, never with NO_COLOR or
in a pipe. The terminal is a real pseudo-terminal (pty)."""

from __future__ import annotations

import os
import pty
import subprocess

from cli_daemon import CCSUP, FAST, ccsup

from supervisor.cli.views.colour import paint_column, state_colour

ESC = "\x1b["


def on_a_terminal(args: list[str], env: dict) -> str:
    """What `ccsup ARGS` writes to a terminal (stdout and stderr both on a pty)."""
    main, sub = pty.openpty()
    try:
        proc = subprocess.Popen([*CCSUP, *args], stdin=sub, stdout=sub, stderr=sub, env=env)
        os.close(sub)
        chunks = []
        while True:
            try:
                data = os.read(main, 65536)
            except OSError:  # EIO: the other side closed
                break
            if not data:
                break
            chunks.append(data)
        proc.wait(timeout=30)
    finally:
        os.close(main)
    return b"".join(chunks).decode(errors="replace")


def test_paint_column_colours_the_cells_of_one_column_only():
    lines = ["KEY  STATE  TURN", "t    held   abc", "u    free   -", "", "POS  WHY"]
    painted = paint_column(lines, "STATE", state_colour)
    assert painted[1] == f"t    {ESC}32mheld{ESC}0m   abc"
    assert painted[2].startswith(f"u    {ESC}90mfree{ESC}0m")
    assert painted[0] == lines[0] and painted[3:] == lines[3:]


def test_an_error_is_red_on_a_terminal_and_plain_with_no_color_or_in_a_pipe(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "CCSUP_CONFIG")}
    env |= {"CCSUP_STATE_DIR": str(tmp_path), "TERM": "xterm"}
    shown = on_a_terminal(["ps"], env)
    assert f"{ESC}31m{ESC}1mccsup:{ESC}0m no supervisor is running" in shown.replace(
        f"{ESC}1m{ESC}31m", f"{ESC}31m{ESC}1m"
    )
    plain = on_a_terminal(["ps"], env | {"NO_COLOR": "1"})
    assert ESC not in plain and "ccsup: no supervisor is running" in plain
    piped = ccsup("ps", state_dir=tmp_path)
    assert ESC not in piped.stderr


def test_history_outcomes_are_coloured_on_a_terminal(tmp_path):
    (tmp_path / "ccsup.toml").write_text(FAST + "[slots]\ncaps = { t = 1 }\n")
    started = ccsup("start", state_dir=tmp_path)
    assert started.returncode == 0, started.stderr
    try:
        ccsup("run", "--key", "t", "--", "true", state_dir=tmp_path)
        ccsup("run", "--key", "t", "--", "false", state_dir=tmp_path)
        env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
        env |= {"CCSUP_STATE_DIR": str(tmp_path), "CCSUP_CONFIG": str(tmp_path / "ccsup.toml")}
        env["TERM"] = "xterm"
        shown = on_a_terminal(["history"], env)
        assert f"{ESC}32mok{ESC}0m" in shown and f"{ESC}31mexit 1{ESC}0m" in shown
        assert ESC not in ccsup("history", state_dir=tmp_path).stdout
    finally:
        ccsup("stop", state_dir=tmp_path)
