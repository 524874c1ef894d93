"""supervisor.admission.quota, pure: readings checked whole, holds, resets, and the state."""

from __future__ import annotations

import pytest

from supervisor.admission.quota import QuotaBook, ReadingError, Window, window_length, window_name

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    "minutes, name", [(300, "5h"), (10080, "7d"), (1440, "1d"), (90, "90m"), (60, "1h")]
)
def test_window_name_of_minutes(minutes, name):
    assert window_name(minutes) == name
    assert window_length(name) == minutes * 60


def test_a_window_at_hold_at_holds_until_the_latest_reset_of_those_over():
    book = QuotaBook()
    book.record("codex", "5h", 0.97, NOW + 100, NOW, source="cli")
    book.record("codex", "7d", 0.96, NOW + 5000, NOW, source="cli")
    book.record("codex", "day", 0.10, NOW + 9000, NOW, source="cli")
    held = book.holding("codex", NOW, 0.95)
    assert held is not None and held.window == "7d"
    assert book.holding("codex", NOW, 0.97).window == "5h"
    assert book.holding("claude", NOW, 0.95) is None


def test_a_reset_window_is_forgotten_and_frees_the_key():
    book = QuotaBook()
    book.record("codex", "5h", 1.0, NOW + 10, NOW, source="stderr")
    assert book.next_reset() == NOW + 10
    assert book.holding("codex", NOW + 10, 0.95) is None  # at its reset: no longer counted
    gone = book.expire(NOW + 10)
    assert [(k, w.window) for k, w in gone] == [("codex", "5h")]
    assert book.keys(NOW + 10) == [] and book.next_reset() is None


@pytest.mark.parametrize(
    "window, used, resets_at, named",
    [
        ("5h", 1.01, NOW + 60, "'used'"),
        ("5h", -0.01, NOW + 60, "'used'"),
        ("5h", True, NOW + 60, "'used'"),
        ("5h", float("nan"), NOW + 60, "'used'"),
        ("5h", 0.5, NOW, "is in the past"),
        ("5h", 0.5, NOW + 5 * 3600 + 1, "more than the 5h window"),
        ("7d", 0.5, NOW + 7 * 86400 + 1, "more than the 7d window"),
        ("limit", 0.5, NOW + 7 * 86400 + 1, "more than the limit window"),
        ("0h", 0.5, NOW + 60, "'window' '0h'"),
        (5, 0.5, NOW + 60, "'window' must be a name"),
        ("5h", 0.5, "soon", "'resets_at'"),
    ],
)
def test_a_bad_reading_names_its_field_and_changes_nothing(window, used, resets_at, named):
    book = QuotaBook()
    book.record("codex", "5h", 0.2, NOW + 60, NOW, source="cli")
    before = book.to_json()
    with pytest.raises(ReadingError) as refused:
        book.record("codex", window, used, resets_at, NOW, source="bus", request_id="x1")
    assert named in str(refused.value)
    assert book.to_json() == before


def test_a_request_id_is_answered_once():
    book = QuotaBook()
    first = book.record("codex", "5h", 0.99, NOW + 60, NOW, source="bus", request_id="r1")
    again = book.record("codex", "5h", 0.10, NOW + 60, NOW + 1, source="bus", request_id="r1")
    assert first.changed and again.repeat and not again.changed
    assert book.windows("codex", NOW + 1)[0].used == 0.99


def test_state_round_trip_drops_reset_windows_and_skips_bad_entries():
    book = QuotaBook()
    book.record("codex", "5h", 0.99, NOW + 60, NOW, source="bus", request_id="r1")
    book.record("codex", "7d", 0.5, NOW + 6000, NOW, source="codex-session")
    data = book.to_json()
    data["windows"]["claude"] = [{"window": "5h", "used": "lots"}, 7]
    again = QuotaBook()
    problems = again.from_json(data, NOW + 100)
    assert len(problems) == 2 and all("claude" in p for p in problems)
    assert [w.window for w in again.windows("codex", NOW + 100)] == ["7d"]
    assert again.record("codex", "5h", 0.1, NOW + 200, NOW + 100, source="bus",
                        request_id="r1").repeat  # fmt: skip
    assert QuotaBook().from_json("garbage", NOW) == ["quota: expected an object, not str"]


def test_merge_takes_a_newer_reading_only():
    book = QuotaBook()
    book.record("codex", "5h", 0.5, NOW + 600, NOW, source="cli")
    older = Window("5h", 0.99, NOW + 600, "cluster", NOW - 1)
    assert not book.merge("codex", older, NOW)
    newer = Window("5h", 0.99, NOW + 600, "cluster", NOW + 1)
    assert book.merge("codex", newer, NOW + 2)
    assert book.holding("codex", NOW + 2, 0.95) == newer
