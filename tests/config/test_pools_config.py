"""[pools] and [env."<key>"]: parsed in the order written; every bad pool, member or env table is
named with its key, its value and its line, and nothing is taken from a file that has one."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from supervisor import config as cfg
from supervisor.cli.config import config_group

CAPS = '[slots]\ncaps = { "codex:work" = 1, "codex:home" = 1, "codex:spare" = 2, claude = 1 }\n'


def test_pools_and_env_parse_in_the_order_written():
    text = (
        CAPS
        + '[pools]\ncodex = ["codex:home", "codex:work"]\n'
        + '[env."codex:work"]\nCODEX_HOME = "/h/work"\n'
        + '[env."codex:home"]\nCODEX_HOME = "~/home"\nOTHER = "~x"\n'
    )
    parsed = cfg.parse(text, "t.toml", {"HOME": "/h"}).pools
    assert dict(parsed.pools) == {"codex": ("codex:home", "codex:work")}
    assert {k: dict(v) for k, v in parsed.env.items()} == {
        "codex:work": {"CODEX_HOME": "/h/work"},
        "codex:home": {"CODEX_HOME": "/h/home", "OTHER": "~x"},  # ~/ is $HOME, ~x is not
    }
    empty = cfg.parse("", "t.toml").pools
    assert (dict(empty.pools), dict(empty.env)) == ({}, {})


BAD = [
    # (the [pools] or [env] lines after CAPS, the problem's key, words of its message, its line)
    (
        '[pools]\ncodex = ["codex:work", "codex:nope"]\n',
        "pools.codex",
        "unknown member 'codex:nope'",
        4,
    ),
    (
        '[pools]\ncodex = ["codex:work", "codex:work"]\n',
        "pools.codex",
        "'codex:work' is named twice",
        4,
    ),
    ('[pools]\nclaude = ["codex:work"]\n', "pools.claude", "named like a key that has a cap", 4),
    ('[pools]\n"claude:x" = ["codex:work"]\n', 'pools."claude:x"', "has a cap ('claude')", 4),
    (
        '[pools]\na = ["codex:work"]\nb = ["codex:home", "codex:work"]\n',
        "pools.b",
        "'codex:work' is already a member of the pool 'a'",
        5,
    ),
    ('[pools]\na = ["codex:work"]\nb = ["a"]\n', "pools.b", "the member 'a' is a pool itself", 5),
    ("[pools]\ncodex = []\n", "pools.codex", "not an empty array", 4),
    ('[pools]\ncodex = "codex:work"\n', "pools.codex", "not a string", 4),
    ("[pools]\ncodex = [3]\n", "pools.codex", "a member is a key (a string), not an integer", 4),
    ('[pools]\ncodex = ["_machine"]\n', "pools.codex", "bad member '_machine'", 4),
    ('[pools]\n"a/b" = ["codex:work"]\n', 'pools."a/b"', "bad pool name", 4),
    ('[env."codex:nope"]\nX = "1"\n', 'env."codex:nope"', "'codex:nope', which no cap names", 3),
    ('[env."codex:work"]\nX = 1\n', 'env."codex:work".X', "must be a string, not an integer", 4),
    ('[env."codex:work"]\n"A-B" = "1"\n', 'env."codex:work".A-B', "bad variable name 'A-B'", 4),
    ('[env]\n"codex:work" = 1\n', 'env."codex:work"', "must be a table", 4),
]


@pytest.mark.parametrize(("lines", "key", "words", "line"), BAD)
def test_a_bad_pool_or_env_table_is_named_with_its_key_value_and_line(lines, key, words, line):
    text = CAPS + lines
    with pytest.raises(cfg.ConfigProblems) as info:
        cfg.parse(text, "t.toml")
    (problem,) = info.value.problems
    assert problem.key == key, problem
    assert words in problem.message, problem
    assert problem.line == line, problem


def test_pools_that_is_not_a_table_is_named():
    with pytest.raises(cfg.ConfigProblems) as info:
        cfg.parse("pools = 3\n" + CAPS, "t.toml")
    (problem,) = info.value.problems
    assert (problem.key, problem.line) == ("pools", 1)
    assert "must be a table of pool = [members], not an integer" in problem.message


def test_a_member_that_is_a_cluster_key_is_refused():
    text = (
        CAPS
        + '[cluster]\netcd = ["http://127.0.0.1:2379"]\ncaps = { codex = 2 }\n'
        + '[pools]\nall = ["codex:work"]\n'
    )
    with pytest.raises(cfg.ConfigProblems) as info:
        cfg.parse(text, "t.toml")
    (problem,) = info.value.problems
    assert problem.key == "pools.all" and "is a cluster key ([cluster] caps 'codex')" in str(
        problem
    )


def test_config_check_names_the_problem_and_exits_2(tmp_path):
    config = tmp_path / "ccsup.toml"
    config.write_text(CAPS + '[pools]\ncodex = ["codex:work", "codex:gone"]\n')
    result = CliRunner().invoke(config_group, ["check", "--config", str(config)])
    assert result.exit_code == 2, result.output
    assert f"{config}:4: pools.codex: unknown member 'codex:gone'" in result.output
