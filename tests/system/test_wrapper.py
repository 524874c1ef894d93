"""`ccsup run` as a wrapper people know: the command is part of the turn, the caller's
environment and cwd by default, stdin that fits the command, ids people can type."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
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
        assert [line.split()[-1] for line in table if " INDEX " in line] == ["COMMAND"]
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
    from supervisor.cli.ps import format_ps
    from supervisor.cli.views.formats import fit

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


def test_run_passes_the_callers_environment_and_cwd_and_clean_env_the_supervisors(env, tmp_path):
    caller = {**env, "MYVAR": "from the caller"}  # the supervisor was started without it
    said = 'echo "[$MYVAR]"; pwd'
    done = ccsup(caller, "run", "--", "sh", "-c", said, cwd=str(tmp_path))
    assert (done.returncode, done.stdout) == (0, f"[from the caller]\n{tmp_path}\n"), done.stderr
    clean = ccsup(caller, "run", "--clean-env", "--", "sh", "-c", said, cwd=str(tmp_path))
    assert clean.stdout == f"[]\n{tmp_path}\n"
    named = ccsup(caller, "run", "--clean-env", "--env", "MYVAR", "--", "sh", "-c", said)
    assert named.stdout.startswith("[from the caller]\n")
    over = ccsup(caller, "run", "--env", "MYVAR=over", "--", "sh", "-c", said)
    assert over.stdout.startswith("[over]\n")
    # a variable the caller unset is not the supervisor's either: the environment is the caller's
    gone = {k: v for k, v in env.items() if k != "HOME"}
    shown = ccsup(gone, "run", "--", "sh", "-c", 'echo "[${HOME-unset}]"')
    assert shown.stdout == "[unset]\n"


def test_the_environment_stays_out_of_every_state_file_event_and_the_history(env, state_dir):
    secret = "s3cr3t-" + os.urandom(8).hex()
    caller = {**env, "API_KEY": secret}
    go = state_dir / "go"
    first = holding(env, go, "--key", "codex")  # without the secret; the second waits behind it
    second = None
    try:
        assert first.stdout.readline() == b"ready\n"
        ccsup(env, "pause", "codex", "--for", "60s")  # so the second turn waits, in queue.json
        second = subprocess.Popen(
            [*CCSUP, "run", "--json", "--key", "codex", "--"]
            + ["sh", "-c", 'test "$API_KEY" = "$EXPECTED" && echo same'],
            env={**caller, "EXPECTED": secret},
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
        )
        from conftest import wait_until

        def kept() -> list[
            Path
        ]:  # a waiting turn's env: its own 0600 file (supervisor.turns.store)
            files = [p for p in state_dir.rglob("*") if p.is_file()]
            return [p for p in files if secret.encode() in p.read_bytes()]

        (held,) = wait_until(kept, what="the waiting turn's env on disk")
        assert held.stat().st_mode & 0o777 == 0o600
        ccsup(env, "resume", "codex")
        out, _ = second.communicate(timeout=30)
        assert second.returncode == 0
    finally:
        ended(first, go)
        if second is not None and second.poll() is None:
            second.kill()
            second.wait()
    events = out.decode()
    assert '"same' in events and secret not in events
    ccsup(env, "stop")  # the history and every record written out
    found = [
        str(path)
        for path in state_dir.rglob("*")
        if path.is_file() and secret.encode() in path.read_bytes()
    ]
    assert found == []


def under_a_terminal(env, *args: str, timeout: float = 30) -> tuple[int, bytes]:
    """`ccsup ARGS` with a pty as its stdin, stdout and stderr (as from a shell in a terminal):
    its exit status and everything it wrote."""
    import select

    master, slave = os.openpty()
    proc = subprocess.Popen(
        [*CCSUP, *args], env=env, stdin=slave, stdout=slave, stderr=slave, start_new_session=True
    )
    os.close(slave)
    out = b""
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every slave is closed
                    chunk = b""
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
        return proc.wait(timeout=5), out
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_from_a_terminal_a_program_that_reads_stdin_to_its_end_starts_at_once(env):
    started = time.monotonic()
    code, out = under_a_terminal(env, "run", "--", "sh", "-c", "wc -c; [ -t 0 ] || echo notty")
    assert code == 0, out
    assert out.endswith(b"0\r\nnotty\r\n") and time.monotonic() - started < 20
    assert b": started\r\n" in out  # the id line: on a terminal, stderr says it
    # -i forwards the terminal as a pipe (today's behaviour): it then waits for input; here the
    # turn is cancelled by its timeout, which says it did wait
    code, out = under_a_terminal(env, "run", "-i", "--timeout", "1s", "--", "cat")
    assert code == 124, out


def test_t_without_a_terminal_is_a_usage_error(env):
    done = ccsup(env, "run", "-t", "--", "true")
    assert done.returncode == 2 and "-t/--tty needs a terminal on stdin" in done.stderr


class Tmux:
    """A tmux server of this test's own (its socket in tmp_path), one window running `command`."""

    def __init__(self, env, sock: Path, command: str, width: int = 100, height: int = 30):
        self.env, self.base = env, ["tmux", "-S", str(sock)]
        self.tmux("-f", "/dev/null", "new-session", "-d", "-x", str(width), "-y", str(height),
                  command)  # fmt: skip
        self.tmux("set-option", "-g", "status", "off")

    def tmux(self, *args: str) -> str:
        done = subprocess.run(
            [*self.base, *args], env=self.env, capture_output=True, text=True, timeout=10
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-J", "-S", "-100")

    def wait_for(self, text: str, timeout: float = 20) -> str:
        from conftest import wait_until

        try:
            return wait_until(lambda: text in self.screen() and self.screen(), timeout, what=text)
        except TimeoutError:
            raise AssertionError(f"no {text!r} on the screen:\n{self.screen()}") from None

    def close(self) -> None:
        subprocess.run([*self.base, "kill-server"], env=self.env, capture_output=True, timeout=10)


@pytest.mark.skipif(not shutil.which("tmux"), reason="tmux is not installed")
def test_t_gives_a_working_terminal_shown_in_tmux_typed_into_resized_and_ctrl_c(env, tmp_path):
    script = tmp_path / "turn.sh"
    script.write_text(
        "before=$(stty -g)\n"
        f"{' '.join(CCSUP)} run -t -- sh -c "
        '\'[ -t 0 ] && echo "tty $(stty size)"; cat; '
        'while read line; do echo "size $(stty size) $(tput cols)"; done\'\n'
        'echo "EXIT=$?"\n'
        '[ "$(stty -g)" = "$before" ] && echo RESTORED\n'
        "sleep 60\n"
    )
    tmux = Tmux(env, tmp_path / "tmux.sock", f"sh {script}")
    try:
        rows, cols = tmux.tmux("display", "-p", "#{pane_height} #{pane_width}").split()
        tmux.wait_for(f"tty {rows} {cols}")
        tmux.tmux("send-keys", "-l", "hello there")
        tmux.tmux("send-keys", "Enter")
        screen = tmux.wait_for("hello there\nhello there")  # the pty's echo, then cat's
        tmux.tmux("send-keys", "C-d")  # ^D as a byte: the pty's line discipline ends cat's input
        tmux.tmux("resize-window", "-x", "72", "-y", "20")
        from conftest import wait_until

        def sized() -> bool:  # each line typed says the size CMD sees: SIGWINCH's trip is async
            tmux.tmux("send-keys", "x", "Enter")
            return "size 20 72 72" in tmux.screen()

        wait_until(sized, 20, 0.2, what="the new size inside")
        tmux.tmux("send-keys", "C-c")  # ^C as a byte: SIGINT to CMD's foreground group
        screen = tmux.wait_for("EXIT=130")
        assert "RESTORED" in tmux.wait_for("RESTORED"), screen
    finally:
        tmux.close()


def test_a_unique_prefix_names_a_turn_and_an_ambiguous_one_lists_the_matches(env, state_dir):
    from conftest import wait_until

    from supervisor.client.control import Client

    with Client(state_dir) as client:
        for turn_id in ("abc1230000", "abc4560000", "xyz7890000"):
            client.turn("default", ["true"], id=turn_id)
    wait_until(lambda: len(json.loads(ccsup(env, "history", "--json").stdout)) == 3, what="3 ended")
    shown = ccsup(env, "show", "--json", "xyz")
    assert json.loads(shown.stdout)["id"] == "xyz7890000"
    assert ccsup(env, "logs", "abc4").returncode == 0
    cancel = ccsup(env, "cancel", "abc1")
    assert "abc1230000" in cancel.stdout + cancel.stderr
    for command in (["show"], ["cancel"], ["logs"], ["wait"]):
        ambiguous = ccsup(env, *command, "abc")
        assert ambiguous.returncode == 2, (command, ambiguous.stderr)
        assert "'abc' is the start of 2 turn ids: abc1230000, abc4560000" in ambiguous.stderr
    unknown = ccsup(env, "show", "nope")
    assert unknown.returncode == 1 and "no turn nope" in unknown.stderr

    # shell completion (contrib/completion: click's) offers the ids and the keys
    def completed(*words: str) -> list[str]:
        line = {**env, "COMP_WORDS": " ".join(["ccsup", *words]), "COMP_CWORD": str(len(words))}
        done = ccsup({**line, "_CCSUP_COMPLETE": "bash_complete"})
        return [item.split(",", 1)[1] for item in done.stdout.split()]

    assert completed("show", "abc") == ["abc1230000", "abc4560000"]
    assert "default" in completed("run", "--key", "")


def test_the_shipped_completion_scripts_are_what_click_makes_today():
    script = Path(sys.executable).parent / "ccsup"  # the console script, as installed
    if not script.exists():
        pytest.skip("no ccsup console script beside this interpreter")
    contrib = Path(__file__).parents[2] / "contrib" / "completion"
    for shell in ("bash", "zsh", "fish"):
        made = subprocess.run(
            [str(script)],
            env={**os.environ, "_CCSUP_COMPLETE": f"{shell}_source"},
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert made.returncode == 0 and "_CCSUP_COMPLETE" in made.stdout
        assert (contrib / f"ccsup.{shell}").read_text() == made.stdout, f"regenerate ccsup.{shell}"


def test_an_argument_over_128_kib_is_refused_with_one_clear_error_and_nothing_runs(env, state_dir):
    from supervisor.client.control import Client, RemoteError
    from supervisor.wire.args import MAX_ARG_BYTES

    with Client(state_dir) as client:
        with pytest.raises(RemoteError) as caught:
            client.turn("default", ["sh", "-c", "echo ran", "x" * 200_000], id="toobig01")
        assert caught.value.code == "bad_request"
        assert "argument 3 of 'argv' is 200,000 bytes" in caught.value.message
        assert "at most 131,071 bytes" in caught.value.message
        listing = client.ps()
    assert [s for s in listing["slots"] if s.get("turn")] == [] and listing["waits"] == []
    # the largest argument exec takes runs, through the guard's usual start
    done = ccsup(env, "run", "--quiet", "--", "sh", "-c", 'echo "${#1}"', "_", "y" * MAX_ARG_BYTES)
    assert (done.returncode, done.stdout) == (0, f"{MAX_ARG_BYTES}\n"), done.stderr
    # ccsup run says so itself, before asking, exit 2: in-process here, since no exec of ccsup
    # with such an argument would start (the shell gets E2BIG first)
    from click.testing import CliRunner

    from supervisor.cli import main

    big = CliRunner().invoke(main, ["run", "--clean-env", "--env", "BIG=" + "z" * 140_000, "true"])
    assert big.exit_code == 2 and "is 140,004 bytes; exec takes at most 131,071" in big.output


def test_the_python_client_inherits_the_environment_only_when_asked(env, state_dir, monkeypatch):
    from conftest import wait_until

    from supervisor.client.control import Client, RemoteError

    monkeypatch.setenv("ONLY_HERE", "client side")
    with Client(state_dir) as client:
        client.turn("default", ["sh", "-c", 'echo "[$ONLY_HERE]"'], id="explicit01")
        client.turn(
            "default", ["sh", "-c", 'echo "[$ONLY_HERE]"'], id="inherit01", inherit_env=True
        )
        client.turn("default", ["sh", "-c", "sleep 30"], id="nullin01", stdin="null")
        wait_until(
            lambda: any(s.get("turn") == "nullin01" for s in client.ps()["slots"]),
            what="the null turn running",
        )
        with pytest.raises(RemoteError) as caught:
            client.send("nullin01", "hello")
        assert "has no stdin to write to (stdin: null)" in caught.value.message
        with pytest.raises(RemoteError) as caught:
            client.call("send", id="nullin01", winsize=[10, 10])
        assert "no terminal to resize (stdin: null)" in caught.value.message
        client.cancel("nullin01")
    logs = state_dir / "turns"
    wait_until(lambda: (logs / "inherit01" / "stdout.log").read_bytes(), what="its output")
    wait_until(lambda: (logs / "explicit01" / "stdout.log").read_bytes(), what="its output")
    assert (logs / "inherit01" / "stdout.log").read_text() == "[client side]\n"
    assert (logs / "explicit01" / "stdout.log").read_text() == "[]\n"


@pytest.mark.skipif(not shutil.which("tmux"), reason="tmux is not installed")
def test_t_restores_the_terminal_when_ccsup_run_is_sent_sigterm(env, tmp_path):
    import signal

    from conftest import wait_until

    script = tmp_path / "turn.sh"
    script.write_text(
        "before=$(stty -g)\n"
        f"{' '.join(CCSUP)} run -t -- sh -c 'echo running; exec sleep 60'\n"
        'echo "EXIT=$?"\n'
        '[ "$(stty -g)" = "$before" ] && echo RESTORED\n'
        "sleep 60\n"
    )
    tmux = Tmux(env, tmp_path / "tmux.sock", f"sh {script}")
    try:
        tmux.wait_for("running")

        def requester() -> int | None:
            slots = json.loads(ccsup(env, "ps", "--json").stdout)["slots"]
            pids = [s["requester"]["pid"] for s in slots if s.get("requester")]
            return pids[0] if pids else None

        os.kill(wait_until(requester, what="ccsup run's pid"), signal.SIGTERM)
        tmux.wait_for("EXIT=143")
        tmux.wait_for("RESTORED")
    finally:
        tmux.close()
