"""supervisor.admission.quota_signals on the exact bytes the pinned harnesses write
(../shared/harness-quota-signals.md: Codex 0.171.0, Claude Code 2.1.332, OpenCode 1.18.33)."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import pytest

from supervisor.admission.quota_signals import (
    Reading,
    SignalError,
    claude_statusline,
    claude_stream_line,
    codex_session_line,
    limit_text,
    opencode_line,
)

CODEX_TOKEN_COUNT = (
    b'{"timestamp":"2026-12-07T10:02:08.334Z","type":"event_msg","payload":{"type":"token_count",'
    b'"info":{"total_token_usage":{"input_tokens":10}},"rate_limits":{"limit_id":"codex",'
    b'"limit_name":null,"primary":{"used_percent":42.5,"window_minutes":300,"resets_at":1796641327},'
    b'"secondary":{"used_percent":12.0,"window_minutes":10080,"resets_at":1796896927},'
    b'"credits":null,"individual_limit":null,"spend_control_reached":null,"plan_type":null,'
    b'"rate_limit_reached_type":null}}}'
)


def test_codex_token_count_gives_both_windows_as_fractions():
    assert codex_session_line(CODEX_TOKEN_COUNT) == [
        Reading("5h", 0.425, 1796641327.0, "codex-session"),
        Reading("7d", 0.12, 1796896927.0, "codex-session"),
    ]


def test_codex_lines_without_windows_give_nothing():
    null_reset = CODEX_TOKEN_COUNT.replace(b'"resets_at":1796896927', b'"resets_at":null')
    assert [r.window for r in codex_session_line(null_reset)] == ["5h"]
    no_limits = (
        b'{"type":"event_msg","payload":{"type":"token_count","info":null,"rate_limits":null}}'
    )
    assert codex_session_line(no_limits) == []
    assert codex_session_line(b'{"type":"event_msg","payload":{"type":"task_complete"}}') == []


@pytest.mark.parametrize(
    "line",
    [
        CODEX_TOKEN_COUNT[:-40],  # cut short: a file being written
        b'{"payload":{"type":"token_count","rate_limits":{"primary":"x"}}}',
        b'{"payload":{"type":"token_count","rate_limits":{"primary":{"used_percent":1,'
        b'"window_minutes":0,"resets_at":5}}}}',
        b'["token_count","rate_limits"]',
    ],
)
def test_a_malformed_codex_line_is_a_signal_error(line):
    with pytest.raises(SignalError):
        codex_session_line(line)


CLAUDE_EVENT = (
    b'{"type":"rate_limit_event","rate_limit_info":{"status":"allowed","resetsAt":1796641585,'
    b'"rateLimitType":"five_hour","isUsingOverage":false,"unifiedWindows":{"five_hour":'
    b'{"utilization":0.42,"resetsAt":1796641585,"status":"allowed"},"seven_day":{"utilization":0.13,'
    b'"resetsAt":1796937985,"status":"allowed"}}},"uuid":"u1","session_id":"s1"}'
)
CLAUDE_WARNING = (
    b'{"type":"rate_limit_event","rate_limit_info":{"status":"allowed_warning","resetsAt":1796641585,'
    b'"rateLimitType":"five_hour","utilization":0.9237,"surpassedThreshold":0.9,"unifiedWindows":'
    b'{"five_hour":{"utilization":0.9237,"resetsAt":1796641585,"status":"allowed_warning",'
    b'"surpassedThreshold":0.9},"seven_day":{"utilization":0.13,"resetsAt":1796937985,'
    b'"status":"allowed"}}},"uuid":"u2","session_id":"s1"}'
)
CLAUDE_429_ASSISTANT = (
    b'{"type":"assistant","message":{"content":[{"type":"text","text":"You\'ve hit your 5-hour '
    b'limit \xc2\xb7 resets 11:36am (UTC)"}]},"error":"rate_limit","api_error_status":429,'
    b'"api_error":"usage_limit_reached","api_error_params":{"rate_limit_info":{"status":"rejected",'
    b'"resetsAt":1796643411,"rateLimitType":"five_hour"}},"session_id":"s1"}'
)


def test_claude_rate_limit_event_gives_its_unified_windows():
    assert claude_stream_line(CLAUDE_EVENT) == [
        Reading("5h", 0.42, 1796641585.0, "claude-stream"),
        Reading("7d", 0.13, 1796937985.0, "claude-stream"),
    ]
    assert claude_stream_line(CLAUDE_WARNING)[0] == Reading(
        "5h", 0.9237, 1796641585.0, "claude-stream"
    )


def test_claude_rejected_is_full_and_a_429_assistant_line_names_its_reset():
    rejected = CLAUDE_EVENT.replace(b'"status":"allowed","resetsAt":1796641585', b'"status":'
                                    b'"rejected","resetsAt":1796641585')  # fmt: skip
    assert claude_stream_line(rejected)[0] == Reading("5h", 1.0, 1796641585.0, "claude-stream")
    assert claude_stream_line(CLAUDE_429_ASSISTANT) == [
        Reading("5h", 1.0, 1796643411.0, "claude-stream")
    ]
    assert claude_stream_line(b'{"type":"result","result":"done"}') == []


def test_claude_status_line_payload():
    payload = (
        b'{"session_id":"s","model":{"id":"m"},"rate_limits":{"five_hour":{"used_percentage":42,'
        b'"resets_at":1796641699},"seven_day":{"used_percentage":13,"resets_at":1796938099}}}'
    )
    assert claude_statusline(payload) == [
        Reading("5h", 0.42, 1796641699.0, "claude-statusline"),
        Reading("7d", 0.13, 1796938099.0, "claude-statusline"),
    ]
    assert claude_statusline(b'{"session_id":"s"}') == []  # before the first answer
    for bad in (b"{not json", b'{"rate_limits":{"five_hour":{"used_percentage":"x"}}}'):
        with pytest.raises(SignalError):
            claude_statusline(bad)


OPENCODE_429 = (
    b'{"type":"error","timestamp":1796640000000,"sessionID":"ses_1","error":{"name":"APIError",'
    b'"data":{"message":"Rate limit reached for requests","statusCode":429,"isRetryable":true,'
    b'"responseHeaders":{"content-type":"application/json","anthropic-ratelimit-unified-5h-reset":'
    b'"1796643938","anthropic-ratelimit-unified-5h-utilization":"1.0",'
    b'"anthropic-ratelimit-unified-5h-status":"rejected","x-codex-primary-used-percent":"100",'
    b'"retry-after":"1"},"responseBody":"{}","metadata":{"url":"http://127.0.0.1/v1/chat/completions"}}}}'
)


def test_opencode_error_line_gives_the_headers_windows():
    assert sorted(opencode_line(OPENCODE_429, 1796640000.0), key=lambda r: r.window) == [
        Reading("5h", 1.0, 1796643938.0, "opencode-json")
    ]


def test_opencode_retry_after_alone_holds_the_key_for_it():
    line = (
        b'{"type":"error","error":{"name":"APIError","data":{"statusCode":429,'
        b'"responseHeaders":{"retry-after":"3600"}}}}'
    )
    assert opencode_line(line, 1000.0) == [Reading("limit", 1.0, 4600.0, "opencode-json")]
    date = line.replace(b'"3600"', b'"Thu, 01 Jan 1970 01:16:40 GMT"')
    assert opencode_line(date, 1000.0) == [Reading("limit", 1.0, 4600.0, "opencode-json")]
    openai = line.replace(
        b'"retry-after":"3600"',
        b'"x-ratelimit-remaining-requests":"0","x-ratelimit-reset-requests":"6m0s"',
    )
    assert opencode_line(openai, 1000.0) == [Reading("limit", 1.0, 1360.0, "opencode-json")]
    assert opencode_line(b'{"type":"text","text":"hi"}', 1000.0) == []


def _at(zone: str, *fields: int) -> float:
    return dt.datetime(*fields, tzinfo=ZoneInfo(zone)).timestamp()


def test_codex_limit_message_is_local_time_to_the_end_of_its_minute():
    now = _at("America/New_York", 2026, 12, 7, 6, 0)
    text = (
        "You\u2019ve hit your usage limit. Upgrade to Pro (https://chatgpt.com/explore/pro), visit "
        "https://chatgpt.com/settings/usage to purchase more credits or try again at 6:44 AM."
    )
    tz = ZoneInfo("America/New_York")
    assert limit_text(text, now, tz) == [
        Reading("limit", 1.0, _at("America/New_York", 2026, 12, 7, 6, 45), "stdout")
    ]
    dated = (
        "You\u2019ve hit your usage limit. Visit https://chatgpt.com/settings/usage to purchase "
        "more credits or try again at Dec 10th, 2026 10:02 AM."
    )
    assert limit_text(dated, now, tz)[0].resets_at == _at("America/New_York", 2026, 12, 10, 10, 3)
    assert limit_text("You\u2019ve hit your usage limit. Try again later.", now, tz) == []


def test_claude_limit_message_is_read_in_the_zone_it_names():
    now = _at("UTC", 2026, 12, 7, 10, 0)
    text = "You've hit your 5-hour limit \u00b7 resets 11:36am (UTC)"
    local = ZoneInfo("Asia/Tokyo")  # the machine's zone does not matter: the message names UTC
    assert limit_text(text, now, local) == [
        Reading("5h", 1.0, _at("UTC", 2026, 12, 7, 11, 37), "stdout")
    ]
    weekly = "You've hit your weekly limit \u00b7 resets Dec 9, 5:43pm (UTC)"
    assert limit_text(weekly, now, local) == [
        Reading("7d", 1.0, _at("UTC", 2026, 12, 9, 17, 44), "stdout")
    ]
    with pytest.raises(SignalError):
        limit_text("You've hit your 5-hour limit \u00b7 resets 11:36am (Mars/Base)", now, local)
