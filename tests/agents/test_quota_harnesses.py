"""The real harnesses (npm, pinned) tell ccsup where their provider windows stand: a scripted
provider on 127.0.0.1 sends the rate-limit headers, the harness writes them where it writes them
(Codex: its session file; Claude Code: stream-json's rate_limit_event; OpenCode: its JSON error),
ccsup reads them and holds the key's next turn until the reset. Few and short: each is one
harness run of one model request."""

from __future__ import annotations

import time

from npm_harness import harness_bin

from supervisor.agents.scripted import ScriptedProvider


def held_then_started_at_reset(client, log, key: str, turn_id: str) -> tuple[dict, float]:
    """The window that holds `key` (after `turn_id` ended and its output was read), then a
    next turn's grant time: it waits with `quota` in WHY and starts at the reset."""
    log.wait_for(f"turn.{turn_id}.released", timeout=120)
    shown = client.call("quota", action="show", key=key)["keys"][0]
    assert shown["held"] is not None, shown
    client.turn(key, ["true"], id=f"{turn_id}-next")
    why = client.ps()["waits"][0]["why"]
    assert why["reason"] == "quota" and why["until"] == shown["held"]["resets_at"], why
    log.wait_for(f"turn.{turn_id}-next.released", timeout=30)
    return shown["held"], log.find(f"turn.{turn_id}-next.granted")[0]["ts"]


def test_codex_session_file_windows_hold_the_next_codex_turn_until_the_reset(
    daemon, event_log, tmp_path
):
    codex = harness_bin("codex")
    d = daemon(caps="codex = 1")
    log = event_log(d, prefixes=("turn.", "key."))
    home = tmp_path / "home"
    (home / ".codex").mkdir(parents=True)
    reset = {}

    def headers() -> dict[str, str]:  # 97 % used, resetting 5 s after the answer
        reset.setdefault("at", int(time.time()) + 5)
        return {
            "x-codex-primary-used-percent": "97",
            "x-codex-primary-window-minutes": "300",
            "x-codex-primary-reset-at": str(reset["at"]),
        }

    provider = ScriptedProvider([], final="FINAL")
    provider.headers = headers
    (home / ".codex" / "config.toml").write_text(
        'model = "scripted"\nmodel_provider = "scripted"\n[model_providers.scripted]\n'
        f'name = "scripted"\nbase_url = "{provider.url}/v1"\nwire_api = "responses"\n'
        'env_key = "SCRIPTED_KEY"\n'
    )
    env = {"HOME": str(home), "CODEX_HOME": str(home / ".codex"), "SCRIPTED_KEY": "sk-s"}
    argv = [str(codex), "exec", "--skip-git-repo-check", "-s", "read-only", "say hi"]
    try:
        with d.client() as client:
            client.turn("codex", argv, id="cx", cwd=str(tmp_path), env=env, stdin="null")
            held, granted = held_then_started_at_reset(client, log, "codex", "cx")
    finally:
        provider.close()
    assert (held["window"], held["used"], held["source"]) == ("5h", 0.97, "codex-session")
    assert held["resets_at"] == reset["at"]
    assert reset["at"] <= granted < reset["at"] + 1.0, granted - reset["at"]


def claude_env(home, provider) -> dict[str, str | None]:
    """A subscription login, faked as the pinned version allows (an OAuth token): an API key
    gives no windows at all."""
    return {
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": provider.url,
        "ANTHROPIC_API_KEY": None,
        "CLAUDE_CODE_OAUTH_TOKEN": "sk-ant-oat01-scripted-" + "x" * 40,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
    }


def claude_argv(claude) -> list[str]:
    return [str(claude), "-p", "say hi", "--output-format", "stream-json", "--verbose",
            "--model", "claude-sonnet-4-5"]  # fmt: skip


def test_claude_rate_limit_event_at_allowed_warning_holds_the_next_claude_turn_until_the_reset(
    daemon, event_log, tmp_path
):
    claude = harness_bin("claude")
    d = daemon(caps="claude = 1")
    log = event_log(d, prefixes=("turn.", "key."))
    reset = {}

    def headers() -> dict[str, str]:
        reset.setdefault("at", int(time.time()) + 5)
        return {
            "anthropic-ratelimit-unified-status": "allowed_warning",
            "anthropic-ratelimit-unified-5h-status": "allowed_warning",
            "anthropic-ratelimit-unified-5h-utilization": "0.97",
            "anthropic-ratelimit-unified-5h-reset": str(reset["at"]),
            "anthropic-ratelimit-unified-5h-surpassed-threshold": "0.9",
            "anthropic-ratelimit-unified-representative-claim": "five_hour",
        }

    provider = ScriptedProvider([], final="FINAL")
    provider.headers = headers
    try:
        with d.client() as client:
            env = claude_env(tmp_path / "home", provider)
            client.turn("claude", claude_argv(claude), id="cl", cwd=str(tmp_path), env=env,
                        stdin="null")  # fmt: skip
            held, granted = held_then_started_at_reset(client, log, "claude", "cl")
    finally:
        provider.close()
    assert (held["window"], held["used"], held["source"]) == ("5h", 0.97, "claude-stream")
    assert held["resets_at"] == reset["at"]
    assert reset["at"] <= granted < reset["at"] + 1.0, granted - reset["at"]
