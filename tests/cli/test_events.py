"""`ccsup events` for people: a line an event (local time, short id, the
fields that matter), `--json` for scripts, the guards' hints only with `--all`."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time

from cli_daemon import CCSUP, ccsup, cli_daemon_fixture  # noqa: F401 (the cli_daemon fixture)
from conftest import wait_until

from supervisor.cli.views.event_lines import format_event

TURN = "5436214ab0d0487196ac0c362dc4f29a"


def test_an_event_line_has_local_time_a_short_id_and_the_fields_that_matter():
    ts = time.mktime((2026, 12, 2, 10, 11, 12, 0, 0, -1)) + 0.345
    body = {
        "v": 1, "ts": ts, "seq": 10, "turn_seq": 1, "id": TURN, "key": "codex", "position": 1,
        "holder": {"session": "s1", "agent": "reviewer", "pid": None},
        "argv": ["sh", "-c", "echo 'a b'"], "cwd": "/w",
    }  # fmt: skip
    assert format_event(f"turn.{TURN}.queued", body) == (
        "10:11:12.345  turn.5436214a.queued  key=codex position=1 holder=s1/reviewer "
        "argv=sh -c 'echo '\"'\"'a b'\"'\"'' cwd=/w"
    )
    exited = {"ts": ts, "id": TURN, "key": "codex", "code": 0, "signal": None, "wall_s": 1.23456}
    assert format_event(f"turn.{TURN}.exited", exited) == (
        "10:11:12.345  turn.5436214a.exited  key=codex code=0 wall_s=1.235"
    )
    out = {"ts": ts, "id": TURN, "offset": 0, "data": "x" * 100 + "\n"}
    line = format_event(f"turn.{TURN}.stdout", out)
    assert line.endswith("data=" + "x" * 77 + "...") and "\n" not in line


def test_events_prints_lines_hides_guard_hints_unless_all_and_json_is_whole(cli_daemon):
    state_dir = cli_daemon("[slots]\ncaps = { t = 1 }\n")
    followers = {
        name: subprocess.Popen(
            [*CCSUP, "--state-dir", str(state_dir), "events", *args],
            stdout=subprocess.PIPE,
            text=True,
        )
        for name, args in {"plain": [], "all": ["--all"], "json": ["--json"]}.items()
    }
    lines: dict[str, list[str]] = {name: [] for name in followers}
    readers = [
        threading.Thread(target=lambda f=f, n=n: lines[n].extend(f.stdout), daemon=True)
        for n, f in followers.items()
    ]
    for reader in readers:
        reader.start()

    def each_saw(word: str) -> bool:
        return all(any(word in line for line in seen) for seen in lines.values())

    try:
        # The subscriptions are live once a supervisor event reached each of them: a reload.
        while not each_saw("supervisor.reloaded"):
            ccsup("reload", state_dir=state_dir)
            time.sleep(0.2)  # a retry interval, not a wait for something that could be missed
        ran = ccsup("run", "--key", "t", "--", "true", state_dir=state_dir)
        assert ran.returncode == 0
        wait_until(lambda: each_saw(".released"), what="each follower printing the release")
    finally:
        for follower in followers.values():
            follower.terminate()
            follower.wait(timeout=10)
        for reader in readers:
            reader.join(timeout=10)
    plain = [line for line in lines["plain"] if ".turn." not in line and "turn." in line]
    assert all(re.match(r"\d\d:\d\d:\d\d\.\d{3}  turn\.[0-9a-f]{8}\.\w+", x) for x in plain)
    assert [x.split()[1].rsplit(".", 1)[1] for x in plain] == [
        "queued", "granted", "started", "exited", "gone", "released",
    ]  # fmt: skip
    assert not any("guard." in line for line in lines["plain"])
    assert any(" guard." in line for line in lines["all"])
    events = [json.loads(line) for line in lines["json"]]
    released = next(e for e in events if e["topic"].endswith(".released"))
    assert released["body"]["key"] == "t" and len(released["topic"].split(".")[1]) == 32
