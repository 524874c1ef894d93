"""The real harnesses (npm, pinned) tell ccsup where their provider windows stand: a scripted
provider on 127.0.0.1 sends the rate-limit headers, the harness writes them where it writes them
(Codex: its session file; Claude Code: stream-json's rate_limit_event; OpenCode: its JSON error),
ccsup reads them and holds the key's next turn until the reset. Few and short: each is one
harness run of one model request."""

from __future__ import annotations

import time

import harness_sandbox
import pytest
from harness_sandbox import opencode_config
from npm_harness import harness_bin

from supervisor.agents.scripted import ScriptedProvider
from supervisor.polling import wait_until


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


def codex_home(tmp_path, provider) -> dict[str, str | None]:
    home = tmp_path / "home"
    (home / ".codex").mkdir(parents=True, exist_ok=True)
    (home / ".codex" / "config.toml").write_text(
        'model = "scripted"\nmodel_provider = "scripted"\n[model_providers.scripted]\n'
        f'name = "scripted"\nbase_url = "{provider.url}/v1"\nwire_api = "responses"\n'
        'env_key = "SCRIPTED_KEY"\n'
    )
    return {"HOME": str(home), "CODEX_HOME": str(home / ".codex"), "SCRIPTED_KEY": "sk-s"}


def opencode_env(tmp_path, provider) -> dict[str, str | None]:
    home = tmp_path / "home"
    opencode_config(home / ".config", provider)
    return {
        "HOME": str(home),
        "PWD": str(tmp_path),
        "XDG_DATA_HOME": str(home / "data"),
        **harness_sandbox.opencode_env(home, tmp_path),
    }


@pytest.mark.timeout(180)  # OpenCode retries 5 times, and starts slowly on a loaded machine
@pytest.mark.parametrize("harness", ["codex", "claude", "opencode"])
def test_a_usage_limit_429_holds_the_key_until_the_reset_it_names(
    harness, daemon, event_log, tmp_path
):
    binary = harness_bin(harness)
    d = daemon(caps=f"{harness} = 1")
    log = event_log(d, prefixes=("turn.", "key."))
    resets_at = int(time.time()) + 600
    provider = ScriptedProvider([], final="FINAL")
    provider.fail_count = -1
    if harness == "codex":
        body = {"error": {"type": "usage_limit_reached", "message": "limit", "plan_type": "plus",
                          "resets_at": resets_at, "resets_in_seconds": 600}}  # fmt: skip
        headers = {
            "x-codex-primary-used-percent": "100",
            "x-codex-primary-window-minutes": "300",
            "x-codex-primary-reset-at": str(resets_at),
        }
        env = codex_home(tmp_path, provider)
        argv = [str(binary), "exec", "--skip-git-repo-check", "-s", "read-only", "say hi"]
        source = "codex-session"
    elif harness == "claude":
        body = {"type": "error", "error": {"type": "rate_limit_error", "message": "limit"}}
        headers = {
            "anthropic-ratelimit-unified-status": "rejected",
            "anthropic-ratelimit-unified-5h-status": "rejected",
            "anthropic-ratelimit-unified-5h-utilization": "1.0",
            "anthropic-ratelimit-unified-5h-reset": str(resets_at),
            "anthropic-ratelimit-unified-representative-claim": "five_hour",
        }
        env = claude_env(tmp_path / "home", provider)
        argv = claude_argv(binary)
        source = "claude-stream"
    else:
        body = {"error": {"message": "Rate limit reached", "type": "rate_limit_exceeded"}}
        headers = {  # what an Anthropic-compatible gateway says, after 5 retries a second apart
            "retry-after": "1",
            "anthropic-ratelimit-unified-5h-status": "rejected",
            "anthropic-ratelimit-unified-5h-utilization": "1.0",
            "anthropic-ratelimit-unified-5h-reset": str(resets_at),
        }
        env = opencode_env(tmp_path, provider)
        argv = [str(binary), "run", "say hi", "--model", "scripted/m", "--format", "json"]
        source = "opencode-json"
    provider.failure = (429, body, headers)
    try:
        with d.client() as client:
            client.turn(harness, argv, id="t1", cwd=str(tmp_path), env=env, stdin="null")
            exited = log.wait_for("turn.t1.exited", timeout=120)
            output = [
                b.get("data", "") for t in ("stdout", "stderr") for b in log.find(f"turn.t1.{t}")
            ]
            assert exited["code"] == 1, (exited, "".join(output)[-3000:])
            client.turn(harness, ["true"], id="t2")
            log.wait_for("turn.t1.released")
            # its last output is being read (checking_output) until the reader's verdict
            why = wait_until(
                lambda: (w := client.ps()["waits"][0]["why"])["reason"] != "checking_output" and w,
                30,
                what="the reader's verdict",
            )
            shown = client.call("quota", action="show", key=harness)["keys"][0]
    finally:
        provider.close()
    assert why["reason"] == "quota" and why["until"] == resets_at, why
    held = shown["held"]
    assert (held["window"], held["used"], held["source"]) == ("5h", 1.0, source), shown
    assert held["resets_at"] == resets_at
