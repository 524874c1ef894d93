"""`ccsup run` needs no flags, forwards its stdin, and exits with codes a script can tell apart."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from conftest import wait_until

from supervisor.cli.run.exits import EXIT_CODES_HELP, run_exit_status

CCSUP = [sys.executable, "-m", "supervisor"]


@pytest.fixture
def env(daemon, state_dir):
    d = daemon(caps="codex = 1, default = 1")
    environment = dict(os.environ, CCSUP_STATE_DIR=str(state_dir), CCSUP_CONFIG=str(d.config))
    environment.pop("CCSUP_KEY", None)
    environment["D"] = str(state_dir)
    return environment


def run(env, *args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CCSUP, "run", *args], env=env, capture_output=True, text=True, timeout=30, **kw
    )


def test_a_pipe_into_ccsup_run_behaves_like_the_bare_command(env):
    shell = f"printf 'a\\nb\\n' | {' '.join(CCSUP)} run --quiet -- wc -l"
    done = subprocess.run(shell, shell=True, env=env, capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, "2", "")


def test_stdin_is_forwarded_exactly_bytes_and_all_at_10x_and_100x(env, state_dir):
    for size in (300_000, 30_000_000):  # 10x and 1000x a turn's usual input; not UTF-8 either
        blob = state_dir / "blob"
        blob.write_bytes(os.urandom(size))
        with open(blob, "rb") as stdin:
            done = run(env, "--", "sha256sum", stdin=stdin)
        expected = subprocess.run(["sha256sum", str(blob)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split()[0] == expected.stdout.split()[0]


def test_without_a_key_run_uses_ccsup_key_else_default(env):
    keys = []
    for extra in ({}, {"CCSUP_KEY": "codex"}):
        done = run({**env, **extra}, "--json", "--", "true")
        assert done.returncode == 0, done.stderr
        first = json.loads(done.stdout.splitlines()[0])
        keys.append(first["body"]["key"])
    assert keys == ["default", "codex"]
    bad = run({**env, "CCSUP_KEY": "_machine"}, "--", "true")
    assert bad.returncode == 2 and "reserved" in bad.stderr


def run_until(env, go) -> subprocess.Popen:
    """`ccsup run` of a turn that says ready, then holds its slot until the file `go` exists."""
    return subprocess.Popen(
        [
            *CCSUP,
            "run",
            "--",
            "sh",
            "-c",
            f'echo ready; while [ ! -e "{go}" ]; do sleep 0.02; done',
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )


def test_ps_shows_the_requester_of_a_turn_without_labels(env, state_dir):
    go = state_dir / "go"
    proc = run_until(env, go)
    try:
        assert proc.stdout.readline() == b"ready\n"
        ps = subprocess.run([*CCSUP, "ps", "--json"], env=env, capture_output=True, text=True)
        held = [s for s in json.loads(ps.stdout)["slots"] if s["state"] == "held"]
        command = open(f"/proc/{proc.pid}/comm").read().strip()
        assert [s["requester"] for s in held] == [{"pid": proc.pid, "command": command}]
        assert held[0]["pid"] != proc.pid  # the guard's pid; the lock holder is the supervisor
        table = subprocess.run([*CCSUP, "ps"], env=env, capture_output=True, text=True).stdout
        assert f"pid {proc.pid} ({command})" in table
        go.touch()
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_each_exit_code(env, state_dir):
    assert run(env, "--", "sh", "-c", "exit 7").returncode == 7
    timed = run(env, "--timeout", "300ms", "--", "sleep", "30")
    assert timed.returncode == 124 and "was stopped: its time limit ran out" in timed.stderr
    go = state_dir / "go"
    holder = run_until(env, go)
    try:
        assert holder.stdout.readline() == b"ready\n"
        waited = run(env, "--wait-timeout", "0.3", "--", "true")
        assert waited.returncode == 75 and "its --wait-timeout ran out" in waited.stderr
        go.touch()
        assert holder.wait(15) == 0
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    rejected = run(env, "--cwd", str(state_dir / "nowhere"), "--", "true")
    assert rejected.returncode == 65 and "rejected" in rejected.stderr
    # another client cancels it while it runs
    victim = subprocess.Popen(
        [*CCSUP, "run", "--json", "--", "sh", "-c", "echo ready; exec sleep 30"],
        env=env,
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:
        turn_id = json.loads(victim.stdout.readline())["body"]["id"]
        wait_until(lambda: b'"ready' in victim.stdout.readline(), what="the victim's output")
        subprocess.run([*CCSUP, "cancel", turn_id], env=env, check=True, capture_output=True)
        assert victim.wait(15) == 69
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()
    # Ctrl-C while it runs
    interrupted = subprocess.Popen(
        [*CCSUP, "run", "--", "sh", "-c", "echo ready; exec sleep 30"],
        env=env,
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:
        assert interrupted.stdout.readline() == b"ready\n"
        interrupted.send_signal(signal.SIGINT)
        assert interrupted.wait(15) == 130
    finally:
        if interrupted.poll() is None:
            interrupted.kill()
            interrupted.wait()


def test_the_exit_codes_are_in_the_help_and_the_readme():
    done = subprocess.run([*CCSUP, "run", "--help"], capture_output=True, text=True)
    assert " ".join(EXIT_CODES_HELP.split()) in " ".join(done.stdout.split())
    readme = open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md")).read()
    for code in ("124", "75", "130", "69", "65"):
        assert f"| {code} " in readme


@pytest.mark.parametrize(
    "kind, body, exited, stop, interrupted, status",
    [
        ("released", {}, {"code": 3, "signal": None}, None, False, 3),
        ("released", {}, {"code": None, "signal": 9}, None, False, 137),
        ("released", {}, {"code": None, "signal": 15, "reason": "timeout"}, "timeout", False, 124),
        ("released", {}, {"code": None, "signal": 15}, "cancelled", True, 130),
        ("released", {}, {"code": None, "signal": 15}, "cancelled", False, 69),
        ("released", {}, {"code": None, "signal": 15}, "shutdown", False, 69),
        ("released", {}, {"code": None, "reason": "guard_lost"}, None, False, 125),
        ("released", {}, None, None, False, 125),
        ("cancelled", {"reason": "timeout"}, None, None, False, 75),
        ("cancelled", {"reason": "cancelled"}, None, None, True, 130),
        ("cancelled", {"reason": "requester_gone"}, None, None, False, 69),
        ("rejected", {"reason": "bad"}, None, None, False, 65),
    ],
)
def test_run_exit_status_table(kind, body, exited, stop, interrupted, status):
    assert run_exit_status(kind, body, exited, stop, interrupted=interrupted) == status


def test_run_says_why_it_waits_when_the_key_is_paused(env):
    subprocess.run(
        [*CCSUP, "pause", "codex", "--for", "60s", "--reason", "429"], env=env, check=True
    )
    proc = subprocess.Popen(
        [*CCSUP, "run", "--key", "codex", "--", "true"],
        env=env,
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        said = proc.stderr.readline()
        assert said.startswith("ccsup: turn ") and said.endswith(
            ": queued (position 1), waiting for a slot of codex\n"
        )
        assert proc.stderr.readline().startswith("ccsup: codex: paused: 429 (until ")
        subprocess.run([*CCSUP, "resume", "codex"], env=env, check=True, capture_output=True)
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_cancelled_run_says_who_cancelled_it_in_words(env):
    """A waiting `ccsup run` cancelled by another client ends with one sentence that says so
    (`was cancelled before it started by `ccsup cancel``), not the bare `cancelled: cancelled`."""
    subprocess.run([*CCSUP, "pause", "codex", "--for", "60s"], env=env, check=True)
    proc = subprocess.Popen(
        [*CCSUP, "run", "--key", "codex", "--", "true"],
        env=env,
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        said = proc.stderr.readline()
        turn_id = said.split()[2].rstrip(":")
        subprocess.run([*CCSUP, "cancel", turn_id], env=env, check=True, capture_output=True)
        assert proc.wait(15) == 69
        rest = proc.stderr.read()
        assert f"ccsup: turn {turn_id} was cancelled before it started by `ccsup cancel`\n" in rest
        assert "cancelled: cancelled" not in rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
