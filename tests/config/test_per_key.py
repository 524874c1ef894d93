"""Every per-key table of the config goes through one loop (supervisor.config.schema.per_key): a
value that is not a table and each bad key are reported with the dotted key and line, the bad key
is skipped, and the good keys beside it are parsed."""

from __future__ import annotations

import pytest

from supervisor import config as cfg

SRC = "/etc/ccsup.toml"
CLUSTER = '[cluster]\netcd = ["http://127.0.0.1:2379"]\nname = "m1"\n'

# (the table, a good entry and a bad-key entry, the bad key's dotted path, its line, the
# message's start; the same with the bad key renamed, what it parses to; the table as an integer)
TABLES = [
    (
        "slots.caps",
        '[slots]\ncaps = { codex = 2, "a b" = 1 }\n',
        'slots.caps."a b"',
        2,
        "bad cap key: ",
        "[slots]\ncaps = { codex = 2, ab = 1 }\n",
        lambda c: dict(c.caps.caps),
        {"codex": 2, "ab": 1},
        "[slots]\ncaps = 3\n",
    ),
    (
        "slots.rates",
        '[slots]\nrates = { codex = "2/s", "a b" = "1/s" }\n',
        'slots.rates."a b"',
        2,
        "bad cap key: ",
        '[slots]\nrates = { codex = "2/s", ab = "1/s" }\n',
        lambda c: sorted(c.admission.rates),
        ["ab", "codex"],
        "[slots]\nrates = 3\n",
    ),
    (
        "slots.max_runtime",
        '[slots]\nmax_runtime = { codex = "1h", "_x" = "1h" }\n',
        "slots.max_runtime._x",
        2,
        "bad cap key: ",
        '[slots]\nmax_runtime = { codex = "1h", x = "2h" }\n',
        lambda c: dict(c.admission.max_runtime),
        {"codex": 3600.0, "x": 7200.0},
        "[slots]\nmax_runtime = 3\n",
    ),
    (
        "pause_on",
        '[pause_on.codex]\nexit_codes = [75]\n\n[pause_on."a b"]\nexit_codes = [75]\n',
        'pause_on."a b"',
        4,
        "bad cap key: ",
        "[pause_on.codex]\nexit_codes = [75]\n\n[pause_on.ab]\nexit_codes = [75]\n",
        lambda c: sorted(c.admission.pause_on),
        ["ab", "codex"],
        "pause_on = 3\n",
    ),
    (
        "limits",
        '[limits.codex]\npids_max = 64\n\n[limits."a b"]\npids_max = 64\n',
        'limits."a b"',
        4,
        "bad key: ",
        "[limits.codex]\npids_max = 64\n\n[limits.ab]\npids_max = 64\n",
        lambda c: sorted(c.limits),
        ["ab", "codex"],
        "limits = 3\n",
    ),
    (
        "harness",
        '[harness.codex]\ndefault_cap = 2\n\n[harness."codex:x"]\ndefault_cap = 2\n',
        'harness."codex:x"',
        4,
        "bad harness name: a harness name has no :variant part",
        "[harness.codex]\ndefault_cap = 2\n\n[harness.claude]\ndefault_cap = 3\n",
        lambda c: {name: h.default_cap for name, h in c.harness.items()},
        {"codex": 2, "claude": 3},
        "harness = 3\n",
    ),
    (
        "cluster.caps",
        CLUSTER + 'caps = { codex = 2, "a b" = 1 }\n',
        'cluster.caps."a b"',
        4,
        "bad cap key: ",
        CLUSTER + "caps = { codex = 2, ab = 1 }\n",
        lambda c: dict(c.cluster.caps),
        {"codex": 2, "ab": 1},
        CLUSTER + "caps = 3\n",
    ),
]


def problems_of(text: str) -> list[cfg.Problem]:
    with pytest.raises(cfg.ConfigProblems) as info:
        cfg.parse(text, SRC, {})
    return list(info.value.problems)


@pytest.mark.parametrize("table", TABLES, ids=[t[0] for t in TABLES])
def test_a_bad_key_is_reported_with_its_line(table):
    _, text, key, line, message, *_ = table
    (problem,) = problems_of(text)
    assert (problem.key, problem.line) == (key, line)
    assert problem.message.startswith(message), problem.message


@pytest.mark.parametrize("table", TABLES, ids=[t[0] for t in TABLES])
def test_every_good_key_of_a_per_key_table_is_parsed(table):
    *_, good, parsed, expected, _ = table
    assert parsed(cfg.parse(good, SRC, {})) == expected


@pytest.mark.parametrize("table", TABLES, ids=[t[0] for t in TABLES])
def test_a_per_key_table_that_is_not_a_table_says_so(table):
    name, *_, not_a_table = table
    (problem,) = problems_of(not_a_table)
    assert problem.key == name
    assert problem.message.startswith("must be a table of "), problem.message
    assert problem.message.endswith("not an integer"), problem.message
