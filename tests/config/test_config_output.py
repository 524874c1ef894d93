"""[logs] and [metrics] in the configuration: values, defaults, and errors with key and line."""

from __future__ import annotations

import pytest

from supervisor import config
from supervisor.config.logs import LogLimits


def test_defaults_and_values():
    assert config.parse("", "f").logs == LogLimits(512 << 20, 7 * 86400.0, 4 << 30)
    assert config.parse("", "f").metrics.listen is None
    parsed = config.parse(
        '[logs]\nturn_max_bytes = 0\nkeep = "2w"\nmax_bytes = "1GB"\n'
        '[metrics]\nlisten = "[::1]:9464"\n',
        "f",
    )
    assert parsed.logs == LogLimits(None, 14 * 86400.0, 10**9)
    assert parsed.metrics.listen == "[::1]:9464"
    assert config.parse('[logs]\nkeep = "12h"\n', "f").logs.keep == 12 * 3600.0
    assert config.parse("[logs]\nkeep = 0\n", "f").logs.keep is None


@pytest.mark.parametrize(
    "text, problem",
    [
        (
            '[logs]\nkeep = "7 days"\n',
            "f:2: logs.keep: '7 days' is not an age (write it like \"7d\"",
        ),
        ('[logs]\nkeep = "-1d"\n', "f:2: logs.keep:"),
        ('[logs]\nmax_bytes = "lots"\n', "f:2: logs.max_bytes: 'lots' is not a size"),
        (
            "[logs]\nturn_max = 5\n",
            "f:2: logs.turn_max: unknown key (did you mean turn_max_bytes?)",
        ),
        ('[metrics]\nlisten = "localhost"\n', "f:2: metrics.listen: 'localhost' is not an address"),
        ('[metrics]\nlisten = "h:99999"\n', "f:2: metrics.listen:"),
        ("[metrics]\nlisten = 9464\n", "f:2: metrics.listen: must be a string"),
    ],
)
def test_each_problem_names_its_key_and_line(text, problem):
    with pytest.raises(config.ConfigProblems) as err:
        config.parse(text, "f")
    assert problem in str(err.value)


def test_the_defaults_written_down_are_the_defaults_parsed():
    from supervisor.config import logs

    assert config.parse("", "f").logs == logs.DEFAULTS
