"""The `ccsup` command line: usage errors, "not running", formatting, and a real daemon end to end.

The integration tests start a real supervisor with `ccsup start` (a detached subprocess, its own
state directory, short graces) and always stop it: `ccsup stop`, then SIGKILL by pid if it is still
there. They skip only when supervisor.daemon.main cannot be imported.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import ROOT, wait_until

from guardd import procs
from supervisor import __version__
from supervisor.cli import main
from supervisor.cli.output import OutputFollower
from supervisor.cli.ps import format_ps
from supervisor.cli.run.command import turn_exit_status
from supervisor.cli.views.formats import format_age
from supervisor.instance import lock_held

CCSUP = [sys.executable, "-m", "supervisor"]
FAST_CONFIG = """\
[guard]
grace = "300ms"
scan = "200ms"

[slots]
caps = { t = 2, one = 1 }
"""


def ccsup(
    *args: str, state_dir: Path | None = None, timeout: float = 30, **kw
) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("CCSUP_CONFIG", None)
    if state_dir is not None:
        env["CCSUP_STATE_DIR"] = str(state_dir)
        if (state_dir / "ccsup.toml").exists():
            env["CCSUP_CONFIG"] = str(state_dir / "ccsup.toml")
    return subprocess.run([*CCSUP, *args], env=env, capture_output=True, timeout=timeout, **kw)


@pytest.fixture
def runner(state_dir, monkeypatch):
    monkeypatch.setenv("CCSUP_STATE_DIR", str(state_dir))
    monkeypatch.delenv("CCSUP_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(state_dir / "no-config"))
    return CliRunner()


# -- usage, version, help --------------------------------------------------------------------------


def test_version(runner):
    result = runner.invoke(main, ["--version"])
    assert (result.exit_code, result.stdout) == (0, f"ccsup {__version__}\n")


def test_help_points_at_the_docs(runner):
    result = runner.invoke(main, ["--help"])
    text = " ".join(result.stdout.split())
    assert "Docs: README.md" in text and "docs/" in text, result.stdout
    assert (ROOT / "README.md").exists() and (ROOT / "docs" / "configuration.md").exists()


def test_help_lists_every_command(runner):
    result = runner.invoke(main, ["--help"])
    assert result.exit_code == 0
    for command in (
        "start",
        "stop",
        "ps",
        "run",
        "cancel",
        "events",
        "logs",
        "reap",
        "status",
        "reload",
        "config",
    ):
        assert f"\n  {command} " in result.stdout


@pytest.mark.parametrize(
    "args, problem",
    [
        (
            ["start", "--caps", "codex=0"],
            "Invalid value for '--caps': bad cap for 'codex': 0 must be at least 1",
        ),
        (["start", "--caps", "a/b=1"], "Invalid value for '--caps': bad cap key 'a/b'"),
        (
            ["start", "--caps", "codex"],
            "Invalid value for '--caps': bad caps item 'codex': write it as key=N",
        ),
        (
            ["start", "--caps", "codex=two"],
            "bad caps item 'codex=two': 'two' is not a whole number",
        ),
        (
            ["run", "--key", "_machine", "--", "true"],
            "Invalid value for '--key': bad cap key '_machine'",
        ),
        (["run", "--key", "codex"], "Missing argument 'CMD...'"),
        (
            ["run", "--key", "codex", "--wait-timeout", "0", "--", "true"],
            "Invalid value for '--wait-timeout'",
        ),
        (["run", "--key", "codex", "--env", "=x", "--", "true"], "Invalid value for '--env'"),
        (["ps", "--bogus"], "No such option '--bogus'"),
        (["frobnicate"], "No such command 'frobnicate'"),
        (["cancel", "../etc"], "'../etc' is not a turn id"),
        (["logs", "a b"], "'a b' is not a turn id"),
    ],
)
def test_usage_errors_exit_2_naming_the_problem(runner, args, problem):
    result = runner.invoke(main, args)
    assert result.exit_code == 2, result.output
    assert problem in result.stderr


def test_bad_config_file_exits_2_naming_key_and_line(runner, state_dir):
    config = state_dir / "bad.toml"
    config.write_text('[guard]\ngrace = "300ms"\n\n[slots]\ncaps = { codex = 0 }\n')
    result = runner.invoke(main, ["start", "--config", str(config)])
    assert result.exit_code == 2, result.output
    assert f"{config}:5: slots.caps.codex" in result.stderr
    assert not (state_dir / "supervisor.lock").exists()  # nothing was started


@pytest.mark.parametrize(
    "args, loaded",
    [
        (["--version"], []),
        (
            ["ps", "--help"],
            ["help_text", "options", "ps"],
        ),  # help_text: the examples, for help only
        (["reload", "--help"], ["help_text", "reload"]),
        (["config", "--help"], ["config", "help_text"]),
    ],
)
def test_a_command_module_is_imported_only_when_that_command_is_used(args, loaded):
    code = (
        "import sys\n"
        "from supervisor.cli import main\n"
        f"try: main({args!r}, prog_name='ccsup')\n"
        "except SystemExit: pass\n"
        "print(sorted(m[len('supervisor.cli.'):] for m in sys.modules if m.startswith('supervisor.cli.')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=30)
    assert done.stdout.decode().splitlines()[-1] == repr(sorted(["where", *loaded]))


def test_reading_the_config_imports_none_of_the_supervisors_policy():
    """Every command reads the config: it builds settings (supervisor.config.admission,
    config.logs) and imports none of the policy that acts on them, nor what that needs."""
    policy = [
        "supervisor.admission.policy",
        "supervisor.admission.pause_on",
        "supervisor.admission.pauses",
    ]
    policy += [
        "supervisor.admission.rates",
        "supervisor.admission.runtime_limits",
        "supervisor.turns.fairness",
    ]
    policy += ["supervisor.output.retention", "subprocess", "logging", "shutil"]
    code = (
        "import sys\n"
        "from supervisor import config\n"
        "config.parse('[slots]\\nrates = { codex = \"2/min\" }\\n[pause_on.codex]\\nstderr = \"429\"\\n', 'f')\n"
        f"print([m for m in {policy!r} if m in sys.modules])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=30)
    assert done.stdout.decode().splitlines()[-1] == "[]", done.stderr.decode()


def test_run_passes_everything_after_cmd_to_it(runner, monkeypatch):
    """`ccsup run --key k ls -l --json`: options after CMD belong to CMD, not to ccsup."""
    seen = {}
    monkeypatch.setattr(
        "supervisor.cli.Where.client", lambda self, timeout=5.0: seen.setdefault("x", _Boom())
    )
    result = runner.invoke(main, ["run", "--key", "k", "ls", "-l", "--json"])
    assert result.exit_code == 3 and "x" in seen


class _Boom:
    def __enter__(self):
        from supervisor.errors import NotRunning

        raise NotRunning("no supervisor (test)")

    def __exit__(self, *exc):
        return False


# -- not running -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["status"],
        ["ps"],
        ["ps", "--json"],
        ["stop"],
        ["reload"],
        ["reap"],
        ["cancel", "abc"],
        ["events"],
        ["logs", "abc", "-f"],
        ["run", "--key", "codex", "--", "true"],
    ],
)
def test_commands_without_a_supervisor_exit_3(runner, state_dir, args):
    result = runner.invoke(main, args)
    assert result.exit_code == 3, result.output
    assert (
        result.stderr
        == f"ccsup: no supervisor is running on {state_dir}; start one with `ccsup start`\n"
    )
    assert result.stdout == ""


def test_not_running_through_the_real_entry_point(state_dir):
    done = ccsup("--state-dir", str(state_dir), "ps", timeout=10)
    assert done.returncode == 3
    assert (
        done.stderr.decode()
        == f"ccsup: no supervisor is running on {state_dir}; start one with `ccsup start`\n"
    )


def test_logs_without_follow_reads_the_file_even_when_nothing_runs(runner, state_dir):
    log = state_dir / "turns" / "abc" / "stdout.log"
    log.parent.mkdir(parents=True)
    log.write_bytes(b"one\n\xff\xfetwo")
    result = runner.invoke(main, ["logs", "abc", "--stdout"])
    assert (result.exit_code, result.stdout_bytes) == (0, b"one\n\xff\xfetwo")
    missing = runner.invoke(main, ["logs", "abd", "--stdout"])
    assert missing.exit_code == 1 and "no turn abd on " in missing.stderr


# -- pure pieces -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "seconds, text",
    [
        (None, "-"),
        (-2, "0s"),
        (0, "0s"),
        (3.9, "3s"),
        (59, "59s"),
        (60, "1m00s"),
        (125, "2m05s"),
        (3599, "59m59s"),
        (3600, "1h00m"),
        (3720, "1h02m"),
        (86399, "23h59m"),
        (86400 * 2 + 3 * 3600, "2d03h"),
    ],
)
def test_format_age(seconds, text):
    assert format_age(seconds) == text


@pytest.mark.parametrize(
    "exited, status",
    [
        ({"code": 0, "signal": None, "reason": None}, 0),
        ({"code": 3, "signal": None}, 3),
        ({"code": None, "signal": 9}, 137),
        ({"code": None, "signal": 15}, 143),
        ({"code": 127, "signal": None}, 127),
        ({"code": None, "signal": None, "reason": "guard_lost"}, 125),
        (None, 125),
    ],
)
def test_turn_exit_status(exited, status):
    assert turn_exit_status(exited) == status


def test_format_ps_is_an_aligned_table():
    now = 1000.0
    ps = {
        "slots": [
            {
                "key": "codex",
                "index": 0,
                "cap": 2,
                "state": "held",
                "turn": "t1",
                "holder": {"session": "s1", "agent": "a1", "pid": 5},
                "pid": 4242,
                "groups": [{"pgid": 4243, "leader_start": 1}, {"pgid": 4250, "leader_start": None}],
                "since": 875.0,
                "argv": ["sh", "-c", "echo 'hi there'"],
            },
            {
                "key": "codex",
                "index": 1,
                "cap": 2,
                "state": "free",
                "turn": None,
                "holder": None,
                "pid": None,
                "groups": [],
                "since": None,
            },
        ],
        "waits": [
            {"id": "t2", "key": "codex", "position": 1, "since": 997.0, "holder": {"pid": 77}}
        ],
    }
    assert format_ps(ps, now) == [
        "KEY    INDEX  CAP  STATE  TURN  HOLDER  PID   GROUPS  AGE    COMMAND",
        "codex  0      2    held   t1    s1/a1   4242  2       2m05s  sh -c 'echo '\"'\"'hi there'\"'\"''",
        "codex  1      2    free   -     -       -     -       -      -",
        "",
        "POS  ID  KEY    HOLDER  WAITING  WHY  COMMAND",
        "1    t2  codex  pid 77  3s       -    -",
    ]
    assert (
        format_ps(ps, now, 64)[1]
        == "codex  0      2    held   t1    s1/a1   4242  2       2m05s  sh…"
    )


def test_format_ps_counts_groups_rather_than_listing_hundreds():
    groups = [{"pgid": 10000 + i, "leader_start": None} for i in range(800)]
    slot = {"key": "big", "index": 0, "cap": 1, "state": "held", "turn": "t", "pid": 7}
    row = format_ps({"slots": [{**slot, "groups": groups, "since": None}]}, 0.0)[1]
    assert row.split()[-3:] == ["800", "-", "-"]


def test_output_follower_writes_exact_event_bytes_and_fills_holes_from_the_log(tmp_path):
    log = tmp_path / "stdout.log"
    out = io.BytesIO()
    follower = OutputFollower(log, out)
    follower.on_event({"offset": 0, "data_b64": "Yf8="})  # b"a\xff", exactly
    follower.on_event({"offset": 0, "data_b64": "Yf8="})  # a repeat writes nothing
    log.write_bytes(b"a\xffbc\n")
    follower.on_event({"offset": 4, "data": "\nd"})  # "bc" was lost on the bus: from the log
    assert out.getvalue() == b"a\xffbc\nd" and follower.lost == 0
    follower.on_event({"offset": 9, "data": "z"})  # past what the log has (cut at its limit)
    assert out.getvalue() == b"a\xffbc\ndz" and follower.lost == 3


def test_output_follower_without_file_places_event_text_by_offset(tmp_path):
    out = io.BytesIO()
    follower = OutputFollower(tmp_path / "missing.log", out)
    for offset, data in [(0, "abc"), (0, "abc"), (3, "de"), (2, "cdef")]:
        follower.on_event({"offset": offset, "data": data})
    assert out.getvalue() == b"abcdef"


def test_each_error_kind_replies_with_a_protocol_code_that_maps_back_to_its_exit_code():
    from supervisor import errors
    from supervisor.wire import protocol

    kinds = (errors.CcsupError, errors.UsageError, errors.ConfigError)
    assert all(kind.code in protocol.ERROR_CODES for kind in kinds)
    assert [errors.exit_code_for(kind.code) for kind in kinds] == [1, 2, 2]


# -- a real daemon ---------------------------------------------------------------------------------


@pytest.fixture
def start_daemon(state_dir):
    """start_daemon(config_text) -> (state_dir, pid): a supervisor started by `ccsup start` on its
    own state directory; always stopped after (`ccsup stop`, then SIGKILL by pid)."""
    pytest.importorskip("supervisor.daemon.main")
    started_pids = []

    def start(config_text: str = FAST_CONFIG):
        (state_dir / "ccsup.toml").write_text(config_text)
        started = ccsup("start", state_dir=state_dir)
        assert started.returncode == 0, started.stderr.decode()
        pid = int(started.stdout.decode().split("(pid ")[1].split(",")[0])
        started_pids.append(procs.identity_of(pid))
        return state_dir, pid

    yield start
    if started_pids:
        ccsup("stop", "--timeout", "10", state_dir=state_dir)
    for ident in started_pids:
        if ident is not None and procs.process_running(ident):
            procs.signal_process(ident, signal.SIGKILL)


@pytest.fixture
def daemon(start_daemon):
    return start_daemon()


def test_start_returns_once_status_answers(daemon):
    state_dir, pid = daemon
    status = ccsup("status", "--json", state_dir=state_dir, timeout=10)
    assert status.returncode == 0, status.stderr
    result = json.loads(status.stdout)
    assert (result["pid"], result["state_dir"], result["version"]) == (
        pid,
        str(state_dir),
        __version__,
    )
    assert lock_held(state_dir / "supervisor.lock")


def test_second_start_exits_1(daemon):
    state_dir, pid = daemon
    again = ccsup("start", state_dir=state_dir, timeout=15)
    assert again.returncode == 1
    assert (
        again.stderr.decode()
        == f"ccsup: a supervisor is already running on {state_dir} (pid {pid})\n"
    )
    foreground = ccsup("start", "--foreground", state_dir=state_dir, timeout=15)
    assert foreground.returncode == 1
    assert "already running" in foreground.stderr.decode()


@pytest.mark.parametrize(
    "script, status",
    [("exit 0", 0), ("exit 3", 3), ("kill -9 $$", 128 + 9), ("kill -TERM $$", 128 + 15)],
)
def test_run_passes_the_exit_status_through(daemon, script, status):
    state_dir, _ = daemon
    done = ccsup("run", "--key", "t", "--", "sh", "-c", script, state_dir=state_dir)
    assert done.returncode == status, done.stderr
    assert done.stderr == b""


def _unstartable(tmp_path: Path, kind: str) -> tuple[str, int, str]:
    """A command that cannot start, its status and the line a shell prints for it."""
    if kind == "not found":
        return "no-such-command-here", 127, "no-such-command-here: command not found"
    if kind == "missing path":
        return "/nonexistent/cmd", 127, "/nonexistent/cmd: No such file or directory"
    path = tmp_path / "script"
    if kind == "bad interpreter":
        path.write_text("#!/nonexistent/sh -e\necho hi\n")
        path.chmod(0o755)
        return (
            str(path),
            127,
            f"{path}: /nonexistent/sh: bad interpreter: No such file or directory",
        )
    if kind == "not executable":
        path.write_text("echo hi\n")
        return str(path), 126, f"{path}: Permission denied"
    if kind == "directory":
        return str(tmp_path), 126, f"{tmp_path}: Is a directory"
    path.write_bytes(b"\x7fELF not really\n")  # "binary"
    path.chmod(0o755)
    return str(path), 126, f"{path}: cannot execute binary file: Exec format error"


@pytest.mark.parametrize(
    "kind",
    ["not found", "missing path", "bad interpreter", "not executable", "directory", "binary"],
)
def test_a_command_that_cannot_start_says_why_as_a_shell_would_through_run_show_and_events(
    daemon, tmp_path, kind
):
    state_dir, _ = daemon
    command, status, line = _unstartable(tmp_path, kind)
    done = ccsup("run", "--key", "t", "--json", "--", command, state_dir=state_dir)
    assert done.returncode == status, done.stderr
    turn_id = json.loads(done.stdout.splitlines()[0])["body"]["id"]
    done = ccsup("run", "--key", "t", "--", command, state_dir=state_dir)
    assert (done.returncode, done.stderr.decode()) == (status, f"ccsup: {line}\n")
    reason = "not_found" if status == 127 else "not_executable"

    def exited() -> list[dict]:
        story = json.loads(ccsup("show", "--json", turn_id, state_dir=state_dir).stdout)
        return [e["body"] for e in story["events"] if e["kind"] == "exited"]

    body = wait_until(exited, 15, 0.05, "the exited event in the history")[0]
    assert (body["code"], body["reason"], body["error"]) == (status, reason, line), body
    shown = ccsup("show", turn_id, state_dir=state_dir)
    assert f"  reason     {reason}: {line}\n" in shown.stdout.decode(), shown.stdout


def test_run_streams_output_exactly(daemon, tmp_path):
    state_dir, _ = daemon
    out_bytes = b"".join(b"line %d \xff\xfe\n" % i for i in range(2000)) + b"no newline at the end"
    err_bytes = b"to stderr \xc3\xa9\n" * 100
    (tmp_path / "out").write_bytes(out_bytes)
    (tmp_path / "err").write_bytes(err_bytes)
    script = (
        "import sys; o=open(sys.argv[1],'rb').read(); e=open(sys.argv[2],'rb').read();"
        "[sys.stdout.buffer.write(o[i:i+1000]) or sys.stdout.flush() for i in range(0, len(o), 1000)];"
        "sys.stderr.buffer.write(e)"
    )
    done = ccsup(
        "run",
        "--key",
        "t",
        "--cwd",
        str(tmp_path),
        "--",
        sys.executable,
        "-c",
        script,
        "out",
        "err",
        state_dir=state_dir,
    )
    assert done.returncode == 0, done.stderr[-500:]
    assert done.stdout == out_bytes
    assert done.stderr == err_bytes


def test_run_json_prints_the_turns_events_in_order(daemon):
    state_dir, _ = daemon
    done = ccsup(
        "run", "--key", "t", "--json", "--", "sh", "-c", "echo hi; exit 4", state_dir=state_dir
    )
    assert done.returncode == 4
    events = [json.loads(line) for line in done.stdout.decode().splitlines()]
    kinds = [e["topic"].rsplit(".", 1)[1] for e in events]
    assert kinds[0] == "queued" and kinds[-1] == "released"
    for kind in ("granted", "started", "exited", "gone"):
        assert kinds.count(kind) == 1, kinds
    assert (
        kinds.index("granted")
        < kinds.index("started")
        < kinds.index("exited")
        < kinds.index("gone")
    )
    stdout = "".join(e["body"]["data"] for e in events if e["topic"].endswith(".stdout"))
    assert stdout == "hi\n"
    seqs = [e["body"]["seq"] for e in events]
    assert seqs == sorted(seqs)


def test_ps_json_shape(daemon):
    state_dir, _ = daemon
    done = ccsup("ps", "--json", state_dir=state_dir, timeout=10)
    assert done.returncode == 0, done.stderr
    ps = json.loads(done.stdout)
    # keys: paused and rate-held; slot_keys: each key's slots by state
    assert set(ps) == {"slots", "slot_keys", "waits", "keys"}
    assert ps["waits"] == [] and ps["keys"] == []
    assert ps["slots"] == []  # nothing is taken: free slots are counted, not listed
    mine = [t for t in ps["slot_keys"] if t["key"] in ("t", "one")]
    assert mine == [
        {
            "key": "one",
            "cap": 1,
            "free": 1,
            "reserved": 0,
            "held": 0,
            "orphaned": 0,
            "unreadable": 0,
        },
        {"key": "t", "cap": 2, "free": 2, "reserved": 0, "held": 0, "orphaned": 0, "unreadable": 0},
    ]


def test_format_ps_prints_each_keys_tally_then_the_slots_taken():
    ps = {
        "slot_keys": [
            {"key": "codex", "cap": 1000000, "free": 999999, "held": 1}
            | {"reserved": 0, "orphaned": 0, "unreadable": 0}
        ],
        "slots": [],
        "waits": [],
    }
    assert format_ps(ps, 0.0)[:4] == [
        "KEY    CAP      FREE    HELD  RESERVED  ORPHANED  UNREADABLE",
        "codex  1000000  999999  1     0         0         0",
        "",
        "no slot taken",
    ]


def test_ps_shows_a_running_turn_and_a_waiter(daemon):
    state_dir, _ = daemon
    env = dict(
        os.environ, CCSUP_STATE_DIR=str(state_dir), CCSUP_CONFIG=str(state_dir / "ccsup.toml")
    )
    first = subprocess.Popen(
        [
            *CCSUP,
            "run",
            "--key",
            "one",
            "--session",
            "s1",
            "--",
            "sh",
            "-c",
            "echo ready; exec sleep 30",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    second = None
    try:
        assert first.stdout.readline() == b"ready\n"
        second = subprocess.Popen(
            [*CCSUP, "run", "--key", "one", "--", "true"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        said = second.stderr.readline()
        assert said.startswith(b"ccsup: turn ") and said.endswith(
            b": queued (position 1), waiting for a slot of one\n"
        )
        ps = json.loads(ccsup("ps", "--json", state_dir=state_dir).stdout)
        held = [s for s in ps["slots"] if s["key"] == "one"]
        assert [(s["state"], s["holder"]["session"]) for s in held] == [("held", "s1")]
        assert held[0]["pid"] and held[0]["turn"]
        assert [(w["key"], w["position"]) for w in ps["waits"]] == [("one", 1)]
        table = ccsup("ps", state_dir=state_dir).stdout.decode()
        tally, slots = table.split("\n\n")[:2]  # each key's tally, then the slots taken
        assert tally.splitlines()[0].split()[:3] == ["KEY", "CAP", "FREE"]
        assert slots.splitlines()[0].split() == [
            "KEY",
            "INDEX",
            "CAP",
            "STATE",
            "TURN",
            "HOLDER",
            "PID",
            "GROUPS",
            "AGE",
            "MEM",  # the turn's whole tree now, and its key's prediction ([memory])
            "PRED",
            "COMMAND",
        ]
        assert "POS  ID" in table
        first.send_signal(signal.SIGINT)  # Ctrl-C: cancel, then wait until released
        assert first.wait(15) == 130  # as a shell reports Ctrl-C
        assert second.wait(15) == 0
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


def test_stop_returns_only_when_everything_is_gone_and_the_lock_is_free(daemon):
    state_dir, pid = daemon
    run = subprocess.Popen(
        [*CCSUP, "run", "--key", "t", "--", "sh", "-c", "trap '' TERM; sleep 30 & echo $!; wait"],
        env=_env(state_dir),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        sleeper = procs.identity_of(int(run.stdout.readline()))
        assert sleeper is not None
        done = ccsup("stop", "--timeout", "10", state_dir=state_dir)
        # Checked at once: the TERM-ignoring work outlives the 300 ms grace, so a stop that did not
        # wait for the daemon would return while the lock is still held and the sleeper runs.
        assert not lock_held(state_dir / "supervisor.lock")
        assert not procs.process_running(sleeper)
        assert done.returncode == 0, done.stderr
        assert done.stdout.decode() == (
            f"ccsup stopped (state {state_dir}): 1 running turn(s) ended (t 1)\n"
        )
        assert run.wait(10) == 69  # stopped by someone else: EX_UNAVAILABLE
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    wait_until(
        lambda: procs.read_stat(pid) is None or procs.read_stat(pid).zombie,
        5,
        what="the daemon to exit",
    )
    again = ccsup("stop", state_dir=state_dir, timeout=10)
    assert again.returncode == 3


def _env(state_dir: Path) -> dict:
    return dict(
        os.environ, CCSUP_STATE_DIR=str(state_dir), CCSUP_CONFIG=str(state_dir / "ccsup.toml")
    )


def _all_free(state_dir: Path) -> bool:
    ps = json.loads(ccsup("ps", "--json", state_dir=state_dir).stdout)
    return not ps["waits"] and all(s["state"] == "free" for s in ps["slots"])


def test_second_ctrl_c_leaves_at_once_and_the_turn_is_still_stopped(start_daemon):
    state_dir, _ = start_daemon(FAST_CONFIG.replace('grace = "300ms"', 'grace = "2s"'))
    run = subprocess.Popen(
        [*CCSUP, "run", "--key", "one", "--", "sh", "-c", "trap '' TERM; echo ready; sleep 30"],
        env=_env(state_dir),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert run.stdout.readline() == b"ready\n"
        run.send_signal(signal.SIGINT)
        assert run.stderr.readline().decode().endswith(" (Ctrl-C again to stop waiting)\n")
        # The command ignores SIGTERM: the turn is now in its 2 s grace.
        run.send_signal(signal.SIGINT)
        assert run.wait(10) == 130
        assert run.stderr.read().decode().endswith(" is still being stopped; not waiting for it\n")
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    wait_until(
        lambda: _all_free(state_dir), 10, interval=0.1, what="the cancelled turn to be released"
    )


def test_killed_run_gets_its_turn_ended(daemon):
    """`ccsup run` names itself (pid + start ticks) as the holder: SIGKILL it and the turn ends."""
    state_dir, _ = daemon
    run = subprocess.Popen(
        [*CCSUP, "run", "--key", "one", "--", "sh", "-c", "echo ready; exec sleep 30"],
        env=_env(state_dir),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert run.stdout.readline() == b"ready\n"
        ps = json.loads(ccsup("ps", "--json", state_dir=state_dir).stdout)
        [slot] = [s for s in ps["slots"] if s["key"] == "one"]
        assert slot["state"] == "held"
        run.kill()
        run.wait()
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    wait_until(
        lambda: _all_free(state_dir),
        10,
        interval=0.1,
        what="the dead requester's turn to be released",
    )


def test_stop_that_runs_out_of_time_says_what_still_runs(start_daemon):
    state_dir, _ = start_daemon(FAST_CONFIG.replace('grace = "300ms"', 'grace = "3s"'))
    run = subprocess.Popen(
        [
            *CCSUP,
            "run",
            "--key",
            "one",
            "--json",
            "--",
            "sh",
            "-c",
            "trap '' TERM; echo ready; sleep 30",
        ],
        env=_env(state_dir),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        turn_id = None
        for line in run.stdout:
            event = json.loads(line)
            turn_id = event["body"]["id"]
            if event["topic"].endswith(".stdout"):
                break
        done = ccsup("stop", "--timeout", "0.2", state_dir=state_dir)
        assert done.returncode == 1
        message = done.stderr.decode()
        assert message.startswith(
            f"ccsup: the supervisor on {state_dir} is still stopping after 0.2 s; still running: "
        )
        assert f"one[0] held turn {turn_id} (guard pid " in message, message
        assert lock_held(state_dir / "supervisor.lock")
        assert ccsup("stop", "--timeout", "10", state_dir=state_dir).returncode in (0, 3)
        assert not lock_held(state_dir / "supervisor.lock")
    finally:
        if run.poll() is None:
            run.kill()
        run.wait()


def test_logs_prints_a_finished_turns_exact_output(daemon):
    state_dir, _ = daemon
    done = ccsup(
        "run",
        "--key",
        "t",
        "--json",
        "--",
        "sh",
        "-c",
        r"printf 'a\377b\n'; printf 'e\n' >&2",
        state_dir=state_dir,
    )
    assert done.returncode == 0
    turn_id = json.loads(done.stdout.splitlines()[0])["body"]["id"]
    assert ccsup("logs", turn_id, "--stdout", state_dir=state_dir).stdout == b"a\xffb\n"
    assert ccsup("logs", turn_id, "--stderr", state_dir=state_dir).stdout == b"e\n"
    followed = ccsup(
        "logs", turn_id, "-f", "--stdout", state_dir=state_dir, timeout=10
    )  # finished: returns at once
    assert (followed.returncode, followed.stdout) == (0, b"a\xffb\n")


def test_reload_of_a_broken_config_exits_2_and_the_old_one_stays(daemon, tmp_path):
    # The CLI reads no config itself here (none given, an empty XDG home), so the problem is the
    # supervisor's own, found when it re-reads the file it was started with.
    state_dir, _ = daemon
    env = {k: v for k, v in os.environ.items() if k != "CCSUP_CONFIG"}
    env.update(CCSUP_STATE_DIR=str(state_dir), XDG_CONFIG_HOME=str(tmp_path))
    config = state_dir / "ccsup.toml"
    config.write_text(FAST_CONFIG.replace("t = 2", "t = 0"))
    broken = subprocess.run([*CCSUP, "reload"], env=env, capture_output=True, timeout=10)
    assert broken.returncode == 2, broken.stderr
    assert broken.stderr.decode() == (
        f"ccsup: {config}:6: slots.caps.t: a cap must be a whole number from 1 to 1000000, not 0\n"
    )
    status = subprocess.run([*CCSUP, "status", "--json"], env=env, capture_output=True, timeout=10)
    assert json.loads(status.stdout)["caps"] == {"t": 2, "one": 1}
    config.write_text(FAST_CONFIG.replace("t = 2", "t = 3"))
    fixed = subprocess.run([*CCSUP, "reload"], env=env, capture_output=True, timeout=10)
    assert (fixed.returncode, fixed.stdout.decode()) == (
        0,
        f"reloaded {config}: 1 change\n  slots.caps.t: 2 -> 3\n",
    )
    status = json.loads(ccsup("status", "--json", state_dir=state_dir, timeout=10).stdout)
    assert status["caps"] == {"t": 3, "one": 1}


def test_an_unknown_id_gets_one_wording_and_one_exit_code_from_every_command(daemon):
    """show, wait, logs (with and without a stream) and cancel of an id nobody knows: the same
    sentence and exit 1 (a failure to find; 2 is for a malformed id)."""
    state_dir, _ = daemon
    unknown = "0123456789abcdef0123456789abcdef"
    said = (
        f"ccsup: no turn {unknown} on {state_dir}: neither the supervisor nor the history knows it"
    )
    for args in (["show"], ["wait"], ["logs"], ["logs", "--stderr"], ["cancel"]):
        done = ccsup(*args, unknown, state_dir=state_dir)
        assert (done.returncode, done.stderr.decode().split(" (")[0]) == (1, said), args
