"""`ccsup run` as a wrapper people know (issue 26): the command is part of the turn, the caller's
environment and cwd by default, stdin that fits the command, ids people can type."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CCSUP = [sys.executable, "-m", "supervisor"]


@pytest.fixture
def env(daemon, state_dir):
    d = daemon(caps="codex = 2, default = 2")
    environment = dict(os.environ, CCSUP_STATE_DIR=str(state_dir), CCSUP_CONFIG=str(d.config))
    environment.pop("CCSUP_KEY", None)
    return environment


def ccsup(env, *args, **kw) -> subprocess.CompletedProcess:
    kw.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.run(
        [*CCSUP, *args], env=env, capture_output=True, text=True, timeout=30, **kw
    )


def holding(env, go: Path, *extra: str, cwd: str | None = None) -> subprocess.Popen:
    """`ccsup run` of a turn that says ready, then holds its slot until the file `go` exists."""
    script = f'echo ready; while [ ! -e "{go}" ]; do sleep 0.02; done'
    return subprocess.Popen(
        [*CCSUP, "run", "--quiet", *extra, "--", "sh", "-c", script],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )


def ended(proc: subprocess.Popen, go: Path) -> int:
    go.touch()
    try:
        return proc.wait(20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_command_and_its_cwd_are_in_ps_records_history_and_show(env, state_dir, tmp_path):
    go = state_dir / "go"
    work = tmp_path / "some dir"
    work.mkdir()
    proc = holding(env, go, cwd=str(work))
    try:
        assert proc.stdout.readline() == b"ready\n"
        listing = json.loads(ccsup(env, "ps", "--json").stdout)
        held = [s for s in listing["slots"] if s["state"] == "held"]
        assert [s["cwd"] for s in held] == [str(work)]
        assert held[0]["argv"][:2] == ["sh", "-c"] and str(go) in held[0]["argv"][2]
        turn = held[0]["turn"]
        # the slot record and the guard record say it too (an orphan's ps reads those)
        slot = json.loads((state_dir / "slots" / "default" / "slot-0.json").read_text())
        assert (slot["work"]["argv"], slot["work"]["cwd"]) == (held[0]["argv"], str(work))
        guard = json.loads(Path(slot["work"]["record"]).read_text())
        assert (guard["argv"], guard["cwd"]) == (held[0]["argv"], str(work))
        table = ccsup({**env, "COLUMNS": "300"}, "ps").stdout.splitlines()
        assert table[0].split()[-1] == "COMMAND"
        assert any(line.endswith(f"sh -c '{held[0]['argv'][2]}'") for line in table)
    finally:
        assert ended(proc, go) == 0
    story = json.loads(ccsup(env, "show", "--json", turn).stdout)
    assert (story["argv"], story["cwd"]) == (held[0]["argv"], str(work))
    shown = ccsup(env, "show", turn).stdout
    assert f"  cwd        {work}\n" in shown and "  command    sh -c '" in shown
    records = json.loads(ccsup(env, "history", "--json").stdout)
    assert [r["argv"] for r in records if r["id"] == turn] == [held[0]["argv"]]


def test_ps_cuts_the_command_to_the_terminal_and_json_keeps_it_whole(env, state_dir):
    from supervisor.cli.formats import fit, format_ps

    long_arg = "x" * 500
    go = state_dir / "go"
    proc = holding(env, go, "--env", f"LONG={long_arg}")
    try:
        assert proc.stdout.readline() == b"ready\n"
        listing = json.loads(ccsup(env, "ps", "--json").stdout)
        (held,) = [s for s in listing["slots"] if s["state"] == "held"]
        held["argv"] = [*held["argv"], long_arg]
        lines = format_ps(listing, 0.0, 100)
        assert all(len(line) <= 100 for line in lines)
        assert any(line.endswith("…") for line in lines)
        assert fit(["abc"], None) == ["abc"]
    finally:
        assert ended(proc, go) == 0
