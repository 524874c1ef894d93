"""`[memory]` (supervisor.config.memory): what it gives, and each bad value named with its key."""

from __future__ import annotations

import pytest

from supervisor import config
from supervisor.config.memory import DEFAULT_PRESSURE, DEFAULT_RESERVE, MemorySettings
from supervisor.errors import ConfigError

CAPS = '[slots]\ncaps = { codex = 2, "opencode:xai" = 1 }\n'


def parse(text: str) -> MemorySettings:
    return config.parse(CAPS + text, "/etc/ccsup.toml").memory


def test_no_memory_section_is_no_budget_and_the_brake_at_ten_percent():
    assert parse("") == MemorySettings(None, DEFAULT_RESERVE, {}, DEFAULT_PRESSURE)


def test_sizes_auto_and_estimates_of_known_keys():
    got = parse(
        '[memory]\nbudget = "3GiB"\nreserve = "512MiB"\npressure = 0.25\n'
        'estimate = { codex = "1.2GiB", "opencode:xai" = 100000000 }\n'
    )
    assert got.budget == 3 << 30 and got.reserve == 512 << 20 and got.pressure == 0.25
    assert got.estimate == {"codex": int(1.2 * (1 << 30)), "opencode:xai": 100_000_000}
    assert parse('[memory]\nbudget = "auto"\n').budget == "auto"
    assert parse("[memory]\npressure = 0\n").pressure == 0.0  # the brake off


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('budget = "100000GiB"', "memory.budget: '100000GiB' is more than this machine's memory"),
        ("budget = 0", "memory.budget: a size must be more than zero, not 0"),
        ('budget = "-1GiB"', "memory.budget: '-1GiB' is not a size"),
        ('budget = "lots"', "memory.budget: 'lots' is not a size"),
        ('reserve = "-5"', "memory.reserve: '-5' is not a size"),
        ("pressure = 1.5", "memory.pressure: a share is from 0 to 1, not 1.5"),
        ("pressure = -0.1", "memory.pressure: a share is from 0 to 1, not -0.1"),
        ('pressure = "high"', "memory.pressure: a share is a number from 0 to 1, not 'high'"),
        ('estimate = { nobody = "1GiB" }', "memory.estimate.nobody: unknown key 'nobody'"),
        ('estimate = { codex = "0" }', "memory.estimate.codex: a size must be more than zero"),
        ('estimate = { "_x" = "1GiB" }', "memory.estimate._x: bad cap key"),
        ("estimate = 3", "memory.estimate: must be a table"),
        ("budgett = 1", "memory.budgett: unknown key"),
    ],
)
def test_each_bad_value_is_an_error_naming_its_key(text, problem):
    with pytest.raises(ConfigError) as caught:
        parse("[memory]\n" + text + "\n")
    assert problem in str(caught.value), str(caught.value)
