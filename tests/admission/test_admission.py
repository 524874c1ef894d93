"""The admission policy alone: pauses, start rates, runtime limits, fairness, and why a waiter
waits, replayed against an injected clock (no processes, no sleeps)."""

from __future__ import annotations

import random

import pytest

from supervisor.admission.pauses import PauseBook
from supervisor.admission.policy import Admission, WaitReason
from supervisor.admission.rates import RateTable, StartWindows
from supervisor.admission.runtime_limits import RuntimeLimits
from supervisor.config.admission import Rate, parse_rate
from supervisor.turns.fairness import FifoOrdering, SessionOrdering, make_ordering, session_of

T0 = 1_800_000_000.0


def seconds(text: str) -> float:
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    for unit in ("ms", "s", "m", "h"):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * units[unit]
    return float(text)


# -- pauses ---------------------------------------------------------------------------------------


def test_a_bare_harness_pauses_all_its_keys_and_nothing_else():
    book = PauseBook()
    book.pause("opencode", T0 + 60, T0, reason="429", by="cli")
    assert book.paused_until("opencode", T0) == T0 + 60
    assert book.paused_until("opencode:xai", T0) == T0 + 60
    assert book.paused_until("codex", T0) is None
    assert book.paused_until("opencodex:xai", T0) is None
    assert book.paused_until("opencode:xai", T0 + 60) is None  # ends at until, exactly


def test_several_pauses_end_at_the_latest_until_and_a_shorter_one_changes_nothing():
    book = PauseBook()
    assert book.pause("codex", T0 + 30, T0).changed
    assert book.pause("codex", T0 + 90, T0 + 1).changed
    answer = book.pause("codex", T0 + 40, T0 + 2)
    assert not answer.changed and answer.pause.until == T0 + 90
    assert book.paused_until("codex", T0 + 2) == T0 + 90
    # a key paused itself and by its harness: the later end holds it
    book.pause("codex:o3", T0 + 200, T0 + 2)
    assert book.paused_until("codex:o3", T0 + 3) == T0 + 200
    book.pause("codex", T0 + 300, T0 + 3)
    assert book.paused_until("codex:o3", T0 + 3) == T0 + 300


def test_max_pause_caps_a_long_pause_at_now_plus_max_pause():
    book = PauseBook(max_pause=3600)
    answer = book.pause("codex", T0 + 10 * 86400, T0)
    assert answer.capped and answer.pause.until == T0 + 3600
    # asking again later extends it, but never past the new now + max_pause
    answer = book.pause("codex", T0 + 10 * 86400, T0 + 100)
    assert answer.pause.until == T0 + 3700


def test_resume_ends_a_pause_early_and_a_bare_name_resumes_its_keys():
    book = PauseBook()
    book.pause("opencode:xai", T0 + 60, T0)
    book.pause("opencode:glm", T0 + 60, T0)
    book.pause("codex", T0 + 60, T0)
    assert [p.key for p in book.resume("opencode:xai")] == ["opencode:xai"]
    assert book.paused_until("opencode:xai", T0 + 1) is None
    assert [p.key for p in book.resume("opencode")] == ["opencode:glm"]
    assert book.resume("opencode") == []
    assert book.paused_until("codex", T0 + 1) == T0 + 60


def test_a_repeated_request_id_is_answered_the_same_and_changes_nothing():
    book = PauseBook()
    first = book.pause("codex", T0 + 60, T0, request_id="r1")
    book.resume("codex")
    again = book.pause("codex", T0 + 60, T0 + 1, request_id="r1")
    assert first.changed and not again.changed and again.pause == first.pause
    assert book.paused_until("codex", T0 + 1) is None


def test_expire_removes_ended_pauses_and_next_expiry_says_when():
    book = PauseBook()
    book.pause("codex", T0 + 5, T0)
    book.pause("opencode", T0 + 9, T0)
    assert book.next_expiry() == T0 + 5
    assert book.expire(T0 + 4.999) == []
    assert [p.key for p in book.expire(T0 + 5)] == ["codex"]
    assert book.next_expiry() == T0 + 9


def test_a_pause_survives_a_restart_and_one_that_ended_meanwhile_does_not():
    book = PauseBook(max_pause=3600)
    book.pause("codex", T0 + 600, T0, reason="429", by="bus", request_id="r1")
    book.pause("opencode", T0 + 30, T0)
    saved = book.to_json()
    restored = PauseBook(max_pause=100)  # a config that now allows less: capped again
    problems = restored.from_json({**saved, "pauses": saved["pauses"] + [{"key": 3}]}, T0 + 60)
    assert problems == ["pause entry {'key': 3} is malformed"]
    assert [(p.key, p.until, p.reason, p.by) for p in restored.active(T0 + 60)] == [
        ("codex", T0 + 160, "429", "bus")
    ]
    assert not restored.pause("codex", T0 + 999, T0 + 61, request_id="r1").changed
    assert PauseBook().from_json([], T0) == ["pauses: expected an object, not list"]


# -- rates ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, rate",
    [("20/min", Rate(20, 60)), ("3/10s", Rate(3, 10)), (" 1 / h ", Rate(1, 3600))]
    + [("5/500ms", Rate(5, 0.5)), ("2/2m", Rate(2, 120)), ("7/sec", Rate(7, 1))],
)
def test_rates_parse(text, rate):
    assert parse_rate(text, seconds) == rate


@pytest.mark.parametrize("text", ["20", "0/min", "-1/s", "x/min", 20, "3/10s/2", "200000/s"])
def test_bad_rates_are_refused(text):
    with pytest.raises(ValueError):
        parse_rate(text, seconds)


def test_a_rate_applies_to_the_key_else_each_key_of_its_bare_harness_alone():
    table = RateTable({"codex": Rate(20, 60), "opencode": Rate(3, 10), "opencode:xai": Rate(1, 1)})
    assert table.rate_for("codex") == Rate(20, 60)
    assert table.rate_for("codex:o3") == Rate(20, 60)
    assert table.rate_for("opencode:xai") == Rate(1, 1)
    assert table.rate_for("opencode:glm") == Rate(3, 10)
    assert table.rate_for("claude") is None
    windows = StartWindows(table)
    for _ in range(3):
        windows.record("opencode:glm", T0)
    assert windows.next_allowed("opencode:glm", T0) == T0 + 10
    assert windows.next_allowed("opencode:kimi", T0) is None  # its own window


@pytest.mark.parametrize("count, window", [(3, 2.0), (1, 0.5), (20, 60.0)])
def test_granting_at_the_allowed_moments_never_exceeds_the_rate_in_any_window(count, window):
    windows = StartWindows(RateTable({"k": Rate(count, window)}))
    rng = random.Random(count)
    now, grants = T0, []
    for _ in range(200):
        now += rng.choice([0.0, 0.0, 0.001, window / 7, window])
        opens = windows.next_allowed("k", now)
        if opens is not None:
            now = opens  # the head waits for the next allowed moment
        assert windows.next_allowed("k", now) is None
        windows.record("k", now)
        grants.append(now)
    for i, start in enumerate(grants):
        in_window = [g for g in grants[i:] if g < start + window]
        assert len(in_window) <= count, (start, in_window)


def test_the_grants_of_the_current_window_survive_a_restart():
    table = RateTable({"codex": Rate(2, 10)})
    windows = StartWindows(table)
    windows.record("codex", T0)
    windows.record("codex", T0 + 1)
    saved = windows.to_json()
    restored = StartWindows(table)
    assert restored.from_json(saved, T0 + 5) == []
    assert restored.next_allowed("codex", T0 + 5) == T0 + 10
    later = StartWindows(table)
    later.from_json(saved, T0 + 10.5)  # the first one left the window
    assert later.next_allowed("codex", T0 + 10.5) is None
    bad = StartWindows(table)
    assert bad.from_json({"codex": ["x"]}, T0) == ["start window of 'codex' is malformed"]
    assert bad.from_json({"codex": [T0 + 99]}, T0) == [
        "start window of 'codex' has times in the future; dropped"
    ]


# -- runtime limits -------------------------------------------------------------------------------


def test_the_smaller_of_timeout_and_max_runtime_wins_with_bare_harness_fallback():
    limits = RuntimeLimits({"codex": 7200.0, "opencode:xai": 60.0}, expiring_notice=60.0)
    d = limits.deadline("codex:o3", 1800.0, T0)
    assert (d.limit, d.source, d.stop_at, d.warn_at) == (1800.0, "timeout", T0 + 1800, T0 + 1740)
    d = limits.deadline("codex", 9000.0, T0)
    assert (d.limit, d.source) == (7200.0, "max_runtime")
    d = limits.deadline("opencode:xai", None, T0)
    assert (d.limit, d.source, d.warn_at) == (60.0, "max_runtime", T0)  # notice >= limit: at once
    assert limits.deadline("opencode:glm", None, T0) is None
    assert limits.max_for("opencode") is None


# -- fairness -------------------------------------------------------------------------------------


def order(ordering, arrivals, grants_between=()):
    """Rank arrivals (id, session, t); grant the ids in grants_between as they arrive."""
    ranks = {}
    for item_id, session, t in arrivals:
        ranks[item_id] = ordering.rank("k", item_id, session, t)
        if item_id in grants_between:
            ordering.granted(item_id)
            del ranks[item_id]
    return sorted(ranks, key=ranks.__getitem__)


def test_session_fairness_grants_a_second_session_before_the_third_turn_of_the_first():
    arrivals = [("a1", "A", 1.0), ("a2", "A", 2.0), ("a3", "A", 3.0), ("b1", "B", 4.0)]
    assert order(SessionOrdering(), arrivals, {"a1"}) == ["b1", "a2", "a3"]
    assert order(SessionOrdering(), arrivals) == ["a1", "b1", "a2", "a3"]
    assert order(FifoOrdering(), arrivals, {"a1"}) == ["a2", "a3", "b1"]


def test_session_fairness_is_round_robin_and_fifo_within_a_session():
    arrivals = [(f"a{i}", "A", float(i)) for i in range(5)]
    arrivals += [(f"b{i}", "B", 10.0 + i) for i in range(3)] + [("c0", "C", 20.0)]
    assert order(SessionOrdering(), arrivals) == [
        "a0", "b0", "c0", "a1", "b1", "a2", "b2", "a3", "a4"
    ]  # fmt: skip


def test_an_idle_session_earns_no_credit():
    ordering = SessionOrdering()
    for i in range(6):  # A is served six rounds while B waits for nothing
        ordering.rank("k", f"a{i}", "A", float(i))
        ordering.granted(f"a{i}")
    ranks = {i: ordering.rank("k", i, s, t) for i, s, t in [("a6", "A", 7.0), ("b0", "B", 8.0)]}
    ranks["b1"] = ordering.rank("k", "b1", "B", 9.0)
    # B is next (A was just served), then they alternate: B's idle time bought it nothing more
    assert sorted(ranks, key=ranks.__getitem__) == ["b0", "a6", "b1"]


def test_the_session_of_a_waiter():
    assert session_of("s1", 42, "t") == "s:s1"
    assert session_of(None, 42, "t") == "p:42"
    assert session_of(None, None, "t") == "i:t"
    with pytest.raises(ValueError, match="fairness is one of fifo, session, not 'lottery'"):
        make_ordering("lottery")


# -- why a waiter waits ---------------------------------------------------------------------------


def test_why_the_head_waits_and_from_when():
    admission = Admission(PauseBook(), StartWindows(RateTable({"codex": Rate(1, 10)})))
    assert admission.hold("codex", T0) is None
    admission.granted("codex", T0)
    why = admission.hold("codex", T0 + 1)
    assert (why.reason, why.until) == (WaitReason.RATE, T0 + 10)
    admission.pauses.pause("codex", T0 + 30, T0 + 1, reason="429 from provider")
    why = admission.hold("codex", T0 + 1)
    assert why.to_json() == {
        "reason": "paused",
        "until": T0 + 30,
        "detail": "paused: 429 from provider",
    }
    assert admission.why("codex") == why
    behind = admission.behind("codex", 3)
    assert (behind.reason, behind.until) == (WaitReason.BEHIND, T0 + 30)
    assert behind.detail == "2 waiters of the key ahead; the head waits: paused: 429 from provider"
    for refusal, reason in [
        ("key_full", WaitReason.KEY_FULL),
        ("machine_full", WaitReason.MACHINE_CAP),
        ("low_memory", WaitReason.MEMORY_FLOOR),
        ("unreadable", WaitReason.UNREADABLE),
    ]:
        assert admission.refused("codex", refusal).reason is reason
    assert admission.refused("codex", "key_full", free_by=T0 + 99).until == T0 + 99
    admission.granted("codex", T0 + 40)
    assert admission.why("codex") is None


def test_a_paused_or_rate_held_head_holds_everyone_behind_it():
    """Replay: the policy is asked only for the head; a later waiter never overtakes it."""
    admission = Admission(PauseBook(), StartWindows(RateTable({"k": Rate(2, 5)})))
    queue = [f"w{i}" for i in range(7)]
    now, granted = T0, []
    admission.pauses.pause("k", T0 + 3, T0)
    while queue:
        held = admission.hold("k", now)
        if held is not None:
            now = held.until  # the timer fires at the moment the policy named
            continue
        admission.granted("k", now)
        granted.append((queue.pop(0), now - T0))
    assert granted == [
        ("w0", 3.0), ("w1", 3.0), ("w2", 8.0), ("w3", 8.0), ("w4", 13.0), ("w5", 13.0),
        ("w6", 18.0),
    ]  # fmt: skip


def test_a_grant_is_counted_from_when_its_work_started():
    windows = StartWindows(RateTable({"k": Rate(2, 10)}))
    windows.record("k", T0)
    windows.record("k", T0 + 1)
    windows.restamp("k", T0, T0 + 3)  # the first grant's work started late
    assert windows.next_allowed("k", T0 + 5) == T0 + 11
    windows.restamp("k", T0 + 99, T0 + 100)  # unknown: nothing changes
    assert windows.next_allowed("k", T0 + 5) == T0 + 11


# -- the configuration ----------------------------------------------------------------------------

CONFIG_ERRORS = [
    ('[slots]\nrates = { codex = "20/xx" }', "x:2: slots.rates.codex: 'xx' is not a duration"),
    ('[slots]\nrates = { codex = "0/min" }', "x:2: slots.rates.codex: the count of rate"),
    ('[slots]\nrates = { "bad key" = "1/s" }', 'x:2: slots.rates."bad key": bad cap key'),
    ('[slots]\nfairness = "lottery"', 'x:2: slots.fairness: must be "fifo" or "session"'),
    ('[slots]\nmax_pause = "-1s"', "x:2: slots.max_pause: '-1s' is not a duration"),
    ("[slots]\nmax_runtime = { codex = 0 }", "x:2: slots.max_runtime.codex: a duration must be"),
    ('[pause_on.codex]\nstderr = "("', "x:2: pause_on.codex.stderr: '(' is not a valid regular"),
    ('[pause_on.codex]\nexit_codes = ["a"]', "x:2: pause_on.codex.exit_codes: must be a list"),
    ("[pause_on.codex]\nbogus = 1", "x:2: pause_on.codex.bogus: unknown key"),
    ("[pause_on.codex]\n", "x:1: pause_on.codex: needs `stderr` (a pattern) or `exit_codes`"),
    ("pause_on = 3", "x:1: pause_on: must be a table of [pause_on.<key>] tables"),
]


@pytest.mark.parametrize("text, message", CONFIG_ERRORS)
def test_admission_config_errors_name_the_key_and_line(text, message):
    from supervisor import config
    from supervisor.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        config.parse(text, "x")
    assert message in str(err.value)


def test_admission_config_defaults_and_values():
    from supervisor import config

    assert config.parse("", "x").admission.fairness == "fifo"
    parsed = config.parse(
        '[slots]\nrates = { opencode = "3/10s" }\nmax_pause = "10m"\nexpiring_notice = "5s"\n'
        'fairness = "session"\n[pause_on.opencode]\nexit_codes = [75]\nfor = "2m"\n',
        "x",
    ).admission
    assert (parsed.max_pause, parsed.expiring_notice, parsed.fairness) == (600.0, 5.0, "session")
    assert RateTable(parsed.rates).rate_for("opencode:xai") == Rate(3, 10.0)
    assert parsed.pause_on["opencode"].for_ == 120.0


# -- the protocol's additions ---------------------------------------------------------------------


def test_pause_and_resume_requests_parse_and_refuse_exactly():
    from supervisor.wire.args import parse_pause, parse_resume, parse_send
    from supervisor.wire.protocol import ProtocolError

    args = parse_pause({"id": "p1", "key": "opencode", "for": 90, "reason": "429", "v": 1})
    assert (args.id, args.key, args.for_, args.until, args.reason, args.by) == (
        "p1", "opencode", 90.0, None, "429", None
    )  # fmt: skip
    assert args.end(T0) == T0 + 90
    assert parse_pause({"key": "codex", "until": T0}).end(0.0) == T0
    assert parse_resume({"key": "codex:o3"}).key == "codex:o3"
    for bad, message in [
        ({"key": "codex"}, "exactly one of 'for'"),
        ({"key": "codex", "for": 1, "until": T0}, "exactly one of 'for'"),
        ({"key": "codex", "for": 0}, "'for' must be above 0"),
        ({"key": "codex", "for": True}, "'for' must be a number"),
        ({"key": "codex", "until": "tomorrow"}, "'until' must be a time"),
        ({"key": "_machine", "for": 1}, "reserved"),
        ({"key": "codex", "for": 1, "bogus": 1}, "unknown field 'bogus'"),
        ({"key": "codex", "for": 1, "id": "a/b"}, "'id' must be"),
    ]:
        with pytest.raises(ProtocolError, match=message) as err:
            parse_pause(bad)
        assert err.value.code == "bad_request"
    with pytest.raises(ProtocolError, match="unknown field"):
        parse_resume({"key": "codex", "for": 1})
    assert parse_send({"id": "t", "data_b64": "/wA="}).data == b"\xff\x00"
    with pytest.raises(ProtocolError, match="not both"):
        parse_send({"id": "t", "data": "x", "data_b64": "eA=="})
    with pytest.raises(ProtocolError, match="not valid base64"):
        parse_send({"id": "t", "data_b64": "!!"})
