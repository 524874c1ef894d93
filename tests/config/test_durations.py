"""One duration grammar (guardd.durations) for the guard's options and the configuration."""

from __future__ import annotations

import pytest

from guardd import __main__ as guard_main
from guardd.durations import parse_duration
from supervisor import config as cfg
from supervisor.errors import ConfigError

ACCEPTED = [
    ("0.5", 0.5),
    ("2", 2.0),
    ("500ms", 0.5),
    ("2s", 2.0),
    ("1m", 60.0),
    ("1h", 3600.0),
    (".5s", 0.5),
    ("5.", 5.0),
    (" 10 s ", 10.0),
    ("20MS", 0.02),
    ("0", 0.0),
]
REFUSED = ["", "s", ".", "-5s", "+5", "1e3", "inf", "nan", "5 sec", "1d", "1.2.3", "5s5", "0x10"]


@pytest.mark.parametrize("text, seconds", ACCEPTED)
def test_a_duration_reads_the_same_everywhere(text, seconds):
    assert parse_duration(text) == seconds
    assert guard_main.parse_args(["--grace", text, "--", "true"], env={}).grace == seconds
    if seconds > 0:  # the configuration wants more than zero
        assert cfg.duration(text, where="guard.grace") == seconds


@pytest.mark.parametrize("text", REFUSED)
def test_what_is_not_a_duration_is_refused_everywhere(text):
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(text)
    with pytest.raises(guard_main.UsageError, match="--grace: .* is not a duration"):
        guard_main.parse_args(["--grace", text, "--", "true"], env={})
    with pytest.raises(ConfigError, match="guard.grace: .* is not a duration"):
        cfg.duration(text, where="guard.grace")


def test_an_absurdly_long_number_is_refused_as_not_finite():
    text = "9" * 400
    with pytest.raises(guard_main.UsageError, match="must be a finite duration"):
        guard_main.parse_args(["--grace", text, "--", "true"], env={})
    with pytest.raises(ConfigError, match="must be more than zero"):
        cfg.duration(text, where="guard.grace")
