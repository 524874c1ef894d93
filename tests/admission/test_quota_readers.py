"""The quota readers in a running supervisor, with stand-ins that write the pinned harnesses'
exact bytes (the real harnesses: tests/agents/test_quota_harnesses.py)."""

from __future__ import annotations

import json
import time

from conftest import wait_until

from supervisor.admission.quota_readers import POLL


def claude_event(used: float, resets_at: float, status: str = "allowed_warning") -> str:
    return json.dumps(
        {
            "type": "rate_limit_event",
            "rate_limit_info": {
                "status": status,
                "resetsAt": resets_at,
                "rateLimitType": "five_hour",
                "utilization": used,
                "unifiedWindows": {
                    "five_hour": {"utilization": used, "resetsAt": resets_at, "status": status}
                },
            },
            "uuid": "u",
            "session_id": "s",
        },
        separators=(",", ":"),
    )


def test_a_claude_turns_rate_limit_event_holds_the_next_turn_until_the_reset(
    daemon, event_log, tmp_path
):
    d = daemon(caps="claude = 1")
    log = event_log(d)
    line = tmp_path / "line.json"
    resets_at = time.time() + 3.0
    line.write_text(claude_event(0.97, resets_at) + "\n")
    with d.client() as client:
        client.turn("claude", ["sh", "-c", f"echo start; cat {line}; echo end"], id="c1")
        log.wait_for("turn.c1.released")
        quota = log.wait_for("key.claude.quota")
        assert quota["held"] == {"window": "5h", "used": 0.97, "resets_at": resets_at,
                                 "source": "claude-stream", "seen_at": quota["held"]["seen_at"]}  # fmt: skip
        client.turn("claude", ["true"], id="c2")
        assert client.ps()["waits"][0]["why"]["reason"] == "quota"
        log.wait_for("turn.c2.released")
    granted = log.find("turn.c2.granted")[0]["ts"]
    assert resets_at <= granted < resets_at + 1.0


def test_a_codex_session_file_in_the_turns_codex_home_is_read_while_it_runs(
    daemon, event_log, tmp_path
):
    d = daemon(caps="codex = 1")
    log = event_log(d)
    home = tmp_path / "codex-home"
    day = time.strftime("%Y/%m/%d")
    sessions = home / "sessions" / day
    sessions.mkdir(parents=True)
    (sessions / "rollout-old.jsonl").write_text('{"old": "not read"}\n')
    resets_at = int(time.time()) + 300
    record = {
        "timestamp": "2026-12-07T10:02:08.334Z",
        "type": "event_msg",
        "payload": {
            "type": "token_count",
            "info": None,
            "rate_limits": {
                "limit_id": "codex",
                "primary": {"used_percent": 97.0, "window_minutes": 300, "resets_at": resets_at},
                "secondary": {
                    "used_percent": 12.0,
                    "window_minutes": 10080,
                    "resets_at": resets_at + 1000,
                },  # fmt: skip
            },
        },
    }
    script = (
        f"f={sessions}/rollout-2026-12-07T10-00-00-abc.jsonl; printf '%s\\n' '{{\"type\":\"x\"}}'"
        f" > $f; printf '%s\\n' 'garbage {{\"token_count\" \"rate_limits\"' >> $f;"
        f" printf '%s\\n' '{json.dumps(record)}' >> $f;"
        f" while [ ! -e {tmp_path}/go ]; do sleep 0.02; done"
    )
    with d.client() as client:
        client.turn("codex", ["sh", "-c", script], id="x1", env={"CODEX_HOME": str(home)})
        log.wait_for("key.codex.quota", timeout=10 + POLL)
        wait_until(lambda: len(log.find("key.codex.quota")) == 2, what="both windows")
        assert not log.find("turn.x1.exited")  # read while it runs
        quota = log.find("key.codex.quota")[-1]
        assert [(w["window"], w["used"], w["source"]) for w in quota["windows"]] == [
            ("5h", 0.97, "codex-session"),
            ("7d", 0.12, "codex-session"),
        ]
        assert client.call("quota", action="show")["skipped"] == 1  # the garbage line, counted
        (tmp_path / "go").touch()
        log.wait_for("turn.x1.released")
        client.turn("codex", ["true"], id="x2")
        assert client.ps()["waits"][0]["why"]["reason"] == "quota"


def test_limit_text_and_an_opencode_error_hold_their_keys(daemon, event_log, tmp_path):
    d = daemon(caps="opencode = 1, codex = 1")
    log = event_log(d, prefixes=("key.", "turn."))
    headers = {"retry-after": "120", "content-type": "application/json"}
    error = {"type": "error", "error": {"name": "APIError", "data": {
        "message": "Rate limit reached for requests", "statusCode": 429,
        "responseHeaders": headers}}}  # fmt: skip
    (tmp_path / "err.json").write_text(json.dumps(error) + "\n")
    with d.client() as client:
        before = time.time()
        client.turn("opencode", ["sh", "-c", f"cat {tmp_path}/err.json; exit 1"], id="o1")
        held = log.wait_for("key.opencode.quota")["held"]
        assert held["window"] == "limit" and before + 119 < held["resets_at"] < time.time() + 121
        clock = time.strftime("%-I:%M %p", time.localtime(time.time() + 3600))
        text = f"You\u2019ve hit your usage limit. Visit x or try again at {clock}."
        client.turn("codex", ["sh", "-c", f"echo '{text}' >&2; exit 1"], id="x1")
        held = log.wait_for("key.codex.quota")["held"]
        assert held["window"] == "limit" and held["source"] == "stderr"
        assert 3500 < held["resets_at"] - time.time() < 3700
