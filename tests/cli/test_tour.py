"""The README's two-minute tour runs as written and prints what the README shows.

The tour's ```console blocks are parsed (`$ cmd` lines, the lines below each its output) and run
in one bash, from the state the set-up command leaves (a supervisor started by `ccsup start` on
the default state dir, here under a private HOME). A background command (`cmd &`) runs, as the
README says, in its own terminal: a pty of its own, whose transcript is its output. Outputs are
compared token by token after what varies is replaced by placeholders (ids, pids, times, ages,
the private HOME); column widths do not count. An id the README shows is mapped to the real id at
the same place, so a later command that names it (`ccsup cancel 74a3c511`) gets the real one.
"""

from __future__ import annotations

import json
import os
import pty
import queue
import re
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from conftest import ROOT

README_HOME = "/home/you"
MARK = "__tour_step_done__"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
HEX_ID = re.compile(r"[0-9a-f]{8,32}")
VOLATILE = [
    (re.compile(r"/sys/fs/cgroup/\S*?ccsup\.\d+\.\d+"), "<cgroup>"),  # where the mount is
    (re.compile(r"\d\d:\d\d:\d\d(\.\d+)?"), "<time>"),
    (re.compile(r"(?<![\w.])\d+(\.\d+)?(B|KiB|MiB|GiB)(?![\w])"), "<size>"),  # memory figures
    (re.compile(r"(?<![\w.])\d+(\.\d+)?%"), "<percent>"),  # the memory pressure now
    (re.compile(r"(?<![\w.])\d+(\.\d+)?(ms|s|m|h)(\d+m)?(?![\w])"), "<age>"),
    (re.compile(r"\d{3,}"), "<n>"),  # pids, process start times (caps and exit codes are short)
]


@dataclass
class Step:
    command: str
    expected: list[str] = field(default_factory=list)

    @property
    def background(self) -> bool:
        return self.command.rstrip().endswith("&")


def tour_steps(readme: str) -> list[Step]:
    section = readme.split("## A two-minute tour", 1)[1].split("\n## ", 1)[0]
    steps: list[Step] = []
    inside = False
    for line in section.splitlines():
        if line.startswith("```"):
            inside = line.strip() == "```console" if not inside else False
            continue
        if not inside:
            continue
        if line.startswith("$ "):
            steps.append(Step(line[2:]))
        elif steps:
            steps[-1].expected.append(line)
    return steps


def _lines(text: str) -> list[str]:
    """What a reader sees: escapes gone, a line rewritten in place (\\r) as it was last drawn."""
    shown = []
    for line in ANSI.sub("", text).replace("\r\n", "\n").split("\n"):
        line = line.rstrip("\r").split("\r")[-1]
        if line.strip():
            shown.append(line)
    return shown


def _tokens(line: str) -> list[str]:
    return line.split()


def _shape(token: str) -> str:
    token = HEX_ID.sub("<id>", token)
    for pattern, placeholder in VOLATILE:
        token = pattern.sub(placeholder, token)
    return token


class Tour:
    def __init__(self, tmp_path: Path):
        self.tmp = tmp_path
        bin_dir = str(Path(sys.executable).parent)
        self.env = {
            k: v for k, v in os.environ.items() if not k.startswith("CCSUP_") and k != "NO_COLOR"
        }
        self.env.update(
            PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            HOME=str(tmp_path),
            XDG_STATE_HOME=str(tmp_path / ".local" / "state"),
            XDG_CONFIG_HOME=str(tmp_path / ".config"),
            TERM="xterm",
        )
        self.readme_ids: dict[str, str] = {}  # an id the README shows -> the real one
        self.background: list[tuple[int, int]] = []  # (pid of the job, pty master)
        self.supervisors: set[int] = set()
        self.user_terminal, user_side = pty.openpty()
        self.terminal = os.ttyname(user_side)
        os.close(user_side)
        self.bash = subprocess.Popen(
            ["bash", "--norc", "--noprofile"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            env=self.env,
            text=True,
        )
        self.out: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.bash.stdout is not None
        for line in self.bash.stdout:
            self.out.put(line)

    def ccsup(self, *args: str) -> str:
        return subprocess.run(
            ["ccsup", *args], env=self.env, cwd=self.tmp, capture_output=True, text=True, timeout=30
        ).stdout

    def _send(self, text: str) -> list[str]:
        """Run text in the bash; what it printed until the marker, and the marker's words."""
        assert self.bash.stdin is not None
        self.bash.stdin.write(
            f"{text}\n__rc=$?; printf '\\n%s %s\\n' {MARK} \"$!\"; (exit $__rc)\n"
        )
        self.bash.stdin.flush()
        printed = []
        while True:
            line = self.out.get(timeout=45)
            if line.startswith(MARK):
                return [*printed, line]
            printed.append(line)

    def real(self, command: str) -> str:
        """The README's command with each id it shows (or a prefix of one) replaced by the real."""

        def swap(match: re.Match) -> str:
            for shown, real in self.readme_ids.items():
                if real and shown.startswith(match.group()):
                    return real[: len(match.group())]
            return match.group()

        return HEX_ID.sub(swap, command)

    def run(self, step: Step) -> list[str]:
        command = self.real(step.command)
        if not step.background:
            # stdin a terminal, as the user's: `ccsup run` then leaves it alone (stdin "null")
            *printed, _ = self._send(f"{{ {command}\n}} <{self.terminal}")
            return _lines("".join(printed))
        master, slave = pty.openpty()
        terminal = os.ttyname(slave)
        job = command.rstrip().removesuffix("&")
        *_, marker = self._send(f"{job} <{terminal} >{terminal} 2>{terminal} &")
        os.close(slave)
        self.background.append((int(marker.split()[1]), master))
        self._wait_until_admitted(len(self.background))
        return self._transcript(master, len(step.expected))

    def _wait_until_admitted(self, jobs: int) -> None:
        """Handshake: every background job's turn holds a slot or waits, before the next line."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                ps = json.loads(self.ccsup("ps", "--json") or "{}")
            except json.JSONDecodeError:
                ps = {}
            held = [s for s in ps.get("slots", []) if s.get("state") == "held"]
            if len(held) + len(ps.get("waits", [])) == jobs:
                return
            time.sleep(0.05)
        raise AssertionError(f"{jobs} background turns never all held or waited: {ps}")

    @staticmethod
    def _transcript(master: int, lines: int) -> list[str]:
        """The job's terminal once it shows as many whole lines as the README does (at most 30 s):
        a line ended by a newline, or a waiting line drawn in place up to its closing `(Ns)`."""
        text, deadline = "", time.monotonic() + 30
        while time.monotonic() < deadline:
            shown = _lines(text)
            ended = _lines(text.rsplit("\n", 1)[0]) if "\n" in text else []
            if len(ended) >= lines or (len(shown) >= lines and shown[lines - 1].endswith(")")):
                return shown[:lines]
            if select.select([master], [], [], 0.1)[0]:
                try:
                    text += os.read(master, 4096).decode(errors="replace")
                except OSError:
                    break
        return _lines(text)[:lines]

    def compare(self, step: Step, printed: list[str]) -> None:
        expected = [line for line in step.expected if line.strip()]
        shown_home = [line.replace(str(self.tmp), README_HOME) for line in printed]
        assert len(shown_home) == len(expected), _diff(step, expected, shown_home)
        for want, got in zip(expected, shown_home, strict=True):
            want_tokens, got_tokens = _tokens(want), _tokens(got)
            assert [_shape(t) for t in want_tokens] == [_shape(t) for t in got_tokens], _diff(
                step, expected, shown_home
            )
            for w, g in zip(want_tokens, got_tokens, strict=True):
                for shown, real in zip(HEX_ID.findall(w), HEX_ID.findall(g), strict=True):
                    if len(real) > len(self.readme_ids.get(shown, "")):
                        self.readme_ids[shown] = real
        for line in shown_home:
            if started := re.search(r"ccsup started \(pid (\d+)", line):
                self.supervisors.add(int(started.group(1)))

    def close(self) -> None:
        for pid in self.supervisors:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        assert self.bash.stdin is not None
        self.bash.stdin.close()
        try:
            self.bash.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.bash.kill()
            self.bash.wait()
        for pid, master in self.background:
            try:
                os.kill(pid, signal.SIGKILL)  # a job whose turn did not end with the supervisor
            except ProcessLookupError:
                pass
            os.close(master)
        os.close(self.user_terminal)


def _diff(step: Step, expected: list[str], got: list[str]) -> str:
    return f"$ {step.command}\nREADME:\n" + "\n".join(expected) + "\nprinted:\n" + "\n".join(got)


def test_the_readme_tour_runs_as_written_and_prints_what_it_shows(tmp_path):
    steps = tour_steps((ROOT / "README.md").read_text())
    assert steps[0].command == "ccsup stop", "the tour first stops the set-up's supervisor"
    assert sum(step.background for step in steps) == 3
    tour = Tour(tmp_path)
    try:
        *set_up, _ = tour._send(f"ccsup start <{tour.terminal}")  # the set-up command's supervisor
        tour.compare(
            Step("ccsup start", ["ccsup started (pid 1000, state /home/you/.local/state/ccsup)"]),
            _lines("".join(set_up)),
        )
        for step in steps:
            tour.compare(step, tour.run(step))
    finally:
        tour.close()
