"""An adopted turn shows, end to end: a real supervisor runs a turn, is
SIGKILLed, and while none runs `ccsup status` counts the turn waiting for adoption (exit 3); the
next supervisor adopts it, and then `ccsup status`, `ccsup show`, `ccsup history --json`,
`ccsup_turns_adopted_total`, `ps` and the page's `/api/state` all say it was adopted, when and
after what gap, until and after it ends."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.request

import pytest
from conftest import PYTHON, wait_until

from supervisor.history.db import HistoryError, show


def ccsup(state_dir, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-m", "supervisor", "--state-dir", str(state_dir), *args],
        capture_output=True,
        text=True,
        timeout=30,
    )


def _guard_record(state_dir, turn: str) -> dict | None:
    for path in (state_dir / "guards").glob("*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being replaced: the next look finds it
        if data.get("turn") == turn:
            return data
    return None


def _story(state_dir, turn: str) -> dict:
    try:
        return show(state_dir, turn) or {}
    except HistoryError:
        return {}


def _counted(text: str, name: str, key: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(f'{name}{{key="{key}"}} '):
            return float(line.split()[-1])
    return None


@pytest.mark.timeout(120)
def test_an_adopted_turn_shows_in_status_show_history_metrics_ps_and_the_page(daemon, state_dir):
    d = daemon(caps="codex = 2", adopt_within="30s")
    web = subprocess.Popen(
        [PYTHON, "-m", "supervisor", "--state-dir", str(state_dir), "--config", str(d.config)]
        + ["web", "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        url = web.stdout.readline().split()[3]

        def holders() -> dict:
            with urllib.request.urlopen(url + "api/state", timeout=5) as r:
                return {h["turn"]: h for h in json.load(r)["state"]["holders"]}

        with d.client() as client:
            client.turn("codex", ["sleep", "300"], id="long")
            client.turn("codex", ["sleep", "300"], id="plain")
            for turn in ("long", "plain"):
                wait_until(
                    lambda t=turn: _story(state_dir, t).get("state") == "started",
                    what=f"{turn} started",
                )
        d.kill()  # SIGKILL: a crash, the OOM killer
        records = [
            wait_until(
                lambda t=turn: (r := _guard_record(state_dir, t)) and r.get("waiting_since") and r,
                what=f"the guard of {turn} waiting for adoption",
            )
            for turn in ("long", "plain")
        ]
        last = max(r["waiting_since"] + r["adopt_within"] for r in records)
        until = time.strftime("%H:%M:%S", time.localtime(last))
        none = ccsup(state_dir, "status")
        assert none.returncode == 3
        assert (
            f"; 2 turns wait for adoption (the last until {until}); start a supervisor to adopt "
            f"them: ccsup start --config {d.config}\n"
        ) in none.stderr, none.stderr  # as the last one was started (supervisor.config.last_start)

        d.start()
        adopted = wait_until(
            lambda: (s := _story(state_dir, "long")).get("adopted_at") and s,
            what="the adoption in the history",
        )
        gap = adopted["adoption_gap_s"]
        assert 0 < gap < 30 and adopted["state"] == "started" and adopted["outcome"] is None
        with d.client() as client:
            status = client.status()
            assert status["waiting_adoption"] == 0, status  # both adopted: none waits
            slots = {s["turn"]: s for s in client.ps()["slots"] if s.get("turn")}
            assert slots["long"]["adopted_at"] is not None
            # AGE counts from the turn's start, not from its adoption.
            started = _story(state_dir, "long")["started_at"]
            assert abs(slots["long"]["since"] - started) < 0.5, (slots["long"], started)
            metrics = client.call("metrics")["text"]
            assert _counted(metrics, "ccsup_turns_adopted_total", "codex") == 2
        text = ccsup(state_dir, "status").stdout.splitlines()
        assert "turns   2 active, 0 waiting (2 adopted at its start)" in text
        assert not any(line.startswith("adopt ") for line in text)  # none waits now
        shown = ccsup(state_dir, "show", "long")
        assert shown.returncode == 0, shown.stderr
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(adopted["adopted_at"]))
        assert f"  adopted    {at} after a gap of {gap:.1f} s" in shown.stdout.splitlines()
        page = wait_until(
            lambda: (h := holders()).get("long", {}).get("adopted_at") and h,
            what="the page's holder marked adopted",
        )
        assert page["long"]["adoption_gap_s"] is not None
        assert abs(page["long"]["since"] - started) < 0.5, page["long"]

        with d.client() as client:
            client.cancel("long")
            client.cancel("plain")
        ended = wait_until(
            lambda: (s := _story(state_dir, "long")).get("outcome") and s, what="the end"
        )
        assert (ended["outcome"], ended["adopted_at"]) == ("cancelled", adopted["adopted_at"])
        listed = ccsup(state_dir, "history", "--json")
        by_id = {r["id"]: r for r in json.loads(listed.stdout)}
        assert by_id["long"]["adoption_gap_s"] == gap
    finally:
        web.send_signal(signal.SIGTERM)
        web.wait(10)
        web.stdout.close()
