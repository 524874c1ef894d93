"""supervisor.polling.wait_until, on a scripted clock: no real time passes."""

from __future__ import annotations

import pytest

from supervisor.polling import wait_until


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_returns_the_first_truthy_value_and_sleeps_between_checks():
    clock, values = Clock(), iter([0, None, "", "ready", "later"])
    got = wait_until(lambda: next(values), 5, 0.25, clock=clock, sleep=clock.sleep)
    assert (got, clock.sleeps) == ("ready", [0.25, 0.25, 0.25])


def test_checks_once_more_at_the_deadline_then_times_out_naming_what():
    clock, calls = Clock(), []
    clock.now = 0.0

    def never() -> bool:
        calls.append(clock.now)
        return False

    with pytest.raises(TimeoutError, match=r"timed out after 1s waiting for the lock"):
        wait_until(never, 1, 0.4, "the lock", clock=clock, sleep=clock.sleep)
    assert calls == pytest.approx([0.0, 0.4, 0.8, 1.0])
    assert clock.sleeps == [0.4, 0.4, pytest.approx(0.2)]
