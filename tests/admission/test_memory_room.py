"""[memory]: real turns admitted by the memory they will use, the whole tree's peak measured, and
the pressure brake. Memory here is real: each test holds at most about
2.5 GiB at once, for a few seconds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from cli_daemon import CCSUP, ccsup, cli_daemon_fixture  # noqa: F401 (the cli_daemon fixture)

from supervisor.polling import wait_until

pytestmark = pytest.mark.timeout(180)

HOG = str(Path(__file__).parent.parent / "helpers" / "memhog.py")
GIB12 = 1229  # MiB: 1.2 GiB


def _run(state_dir: Path, key: str, *hog: str) -> subprocess.Popen:
    env = dict(
        os.environ, CCSUP_STATE_DIR=str(state_dir), CCSUP_CONFIG=str(state_dir / "ccsup.toml")
    )
    return subprocess.Popen(
        [*CCSUP, "run", "--key", key, "--", sys.executable, HOG, *hog],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


class WhySampler:
    """`ccsup ps --json` read again and again: every WHY reason (and detail) a waiter showed."""

    def __init__(self, state_dir: Path):
        self.state_dir = state_dir
        self.seen: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            ps = ccsup("ps", "--json", state_dir=self.state_dir)
            if ps.returncode == 0:
                for wait in json.loads(ps.stdout)["waits"]:
                    if wait.get("why"):
                        self.seen.append(wait["why"])
            self._stop.wait(0.1)

    def stop(self) -> list[dict]:
        self._stop.set()
        self._thread.join(timeout=30)
        return self.seen


def _most_at_once(marker: Path) -> int:
    """From outside: how many turns held their memory at one moment (their touched..released)."""
    spans = [tuple(map(float, p.read_text().split())) for p in marker.iterdir()]
    edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def _all_finish(runs: list[subprocess.Popen]) -> None:
    for run in runs:
        out, err = run.communicate(timeout=120)
        assert run.returncode == 0, (out, err)


def test_budget_with_an_estimate_runs_at_most_two_of_four(cli_daemon, tmp_path):
    state_dir = cli_daemon(
        '[slots]\ncaps = { mem = 4 }\n[memory]\nbudget = "3GiB"\nestimate = { mem = "1.2GiB" }\n'
    )
    marker = tmp_path / "held"
    marker.mkdir()
    sampler = WhySampler(state_dir)
    runs = [_run(state_dir, "mem", str(GIB12), "3", str(marker)) for _ in range(4)]
    _all_finish(runs)
    seen = sampler.stop()
    assert len(list(marker.iterdir())) == 4
    assert _most_at_once(marker) <= 2
    held = [w for w in seen if w["reason"] == "memory"]
    assert held, seen
    assert "needs 1.20GiB (estimate peak of mem)" in held[0]["detail"], held[0]


def test_without_an_estimate_the_fourth_is_held_once_three_have_run(cli_daemon, tmp_path):
    state_dir = cli_daemon('[slots]\ncaps = { mem = 4 }\n[memory]\nbudget = "3GiB"\n')
    for _ in range(3):  # one at a time: learning costs no more than one turn's memory
        _all_finish([_run(state_dir, "mem", str(GIB12), "1")])
    status = json.loads(ccsup("status", "--json", state_dir=state_dir).stdout)
    learned = status["memory"]["keys"]["mem"]
    assert learned["source"] == "learned"
    assert (GIB12 << 20) <= learned["prediction"] <= (GIB12 << 20) * 1.15, learned
    text = ccsup("status", state_dir=state_dir).stdout
    assert "memory  budget 3.00GiB: running turns predicted 0KiB, room 3.00GiB" in text, text
    assert "memory  predicted mem 1.2" in text and "(learned)" in text, text
    exposed = ccsup("metrics", state_dir=state_dir).stdout
    assert "ccsup_memory_budget_bytes 3.221225472e+09" in exposed, exposed
    assert "ccsup_memory_predicted_bytes 0.0" in exposed
    assert 'ccsup_memory_prediction_bytes{key="mem"}' in exposed
    assert 'ccsup_turn_peak_memory_bytes{key="mem"}' in exposed
    assert ("ccsup_memory_pressure_avg10" in exposed) == Path("/proc/pressure/memory").exists()
    marker = tmp_path / "held"
    marker.mkdir()
    sampler = WhySampler(state_dir)
    runs = [_run(state_dir, "mem", str(GIB12), "2", str(marker)) for _ in range(3)]
    _all_finish(runs)
    seen = sampler.stop()
    assert _most_at_once(marker) <= 2
    held = [w for w in seen if w["reason"] == "memory"]
    assert held and "learned peak of mem" in held[0]["detail"], seen


def test_the_peak_of_a_tree_of_twenty_is_the_whole_tree(cli_daemon):
    state_dir = cli_daemon("[slots]\ncaps = { tree = 1 }\n")
    run = _run(state_dir, "tree", "50", "2", "-", "20")
    _all_finish([run])

    def recorded():
        got = ccsup("history", "--json", state_dir=state_dir)
        rows = json.loads(got.stdout) if got.returncode == 0 else []
        return rows[0] if rows and rows[0].get("peak_mem") else None

    row = wait_until(recorded, timeout=30, what="the turn in the history with its peak_mem")
    assert abs(row["peak_mem"] - (1 << 30)) <= 0.15 * (1 << 30), row
    assert row["usage"]["peak_rss_bytes"] < 0.2 * (1 << 30)  # the largest single process's


def _psi(path: Path, avg10: float) -> None:
    text = f"some avg10={avg10:.2f} avg60=0.00 avg300=0.00 total=1\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=1\n"
    path.with_suffix(".tmp").write_text(text)
    path.with_suffix(".tmp").rename(path)


def test_the_pressure_brake_holds_every_grant_and_says_when_it_starts_and_stops(
    cli_daemon, tmp_path, monkeypatch
):
    # The real PSI file cannot be driven here without pressing the whole shared machine (see
    # docs/admission.md): the brake reads a file the test writes, as it reads /proc/pressure/memory.
    psi = tmp_path / "memory"
    _psi(psi, 42.0)
    monkeypatch.setenv("CCSUP_TEST_PSI_FILE", str(psi))
    state_dir = cli_daemon("[slots]\ncaps = { p = 2 }\n")
    events = subprocess.Popen(
        [*CCSUP, "--state-dir", str(state_dir), "events", "--json", "supervisor.pressure"],
        stdout=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(events.stdout), daemon=True)
    reader.start()
    try:
        run = _run(state_dir, "p", "1", "0")

        def why():
            ps = json.loads(ccsup("ps", "--json", state_dir=state_dir).stdout)
            return next((w["why"] for w in ps["waits"] if w.get("why")), None)

        held = wait_until(why, timeout=30, what="the turn waiting")
        assert held["reason"] == "pressure" and "42.00%" in held["detail"], held
        status = json.loads(ccsup("status", "--json", state_dir=state_dir).stdout)["memory"]
        assert status["pressured"] and status["avg10"] == pytest.approx(0.42)
        _psi(psi, 0.0)
        _all_finish([run])
        wait_until(lambda: _pressure_offs(lines), timeout=30, what="supervisor.pressure off")
    finally:
        events.terminate()
        events.wait(timeout=10)
        reader.join(timeout=10)
    assert _pressure_offs(lines)[-1]["avg10"] == 0.0


def _pressure_offs(lines: list[str]) -> list[dict]:
    found = []
    for line in list(lines):
        event = json.loads(line)
        body = event.get("body", event)
        if body.get("on") is False:
            found.append(body)
    return found
