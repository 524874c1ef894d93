"""One grammar: every time option takes the same durations, --state-dir and
--config work before or after the subcommand, and `ps` takes `--key` (repeatable, globs)."""

from __future__ import annotations

import json

import pytest
from cli_daemon import ccsup, cli_daemon_fixture  # noqa: F401 (the cli_daemon fixture)

CONFIG = """\
[slots]
caps = { t = 1, "o:a" = 1, "o:b" = 1 }
"""


@pytest.mark.parametrize(
    "args",
    [
        ["run", "--wait-timeout", "2s", "--", "true"],
        ["run", "--timeout", "2s", "--", "true"],
        ["stop", "--timeout", "5s"],
        ["pause", "t", "--for", "500ms"],
        ["history", "--since", "1h"],  # a fresh state dir: an empty table, exit 0
        ["wait", "abc", "--timeout", "30s"],
    ],
)
def test_every_time_option_takes_a_duration(tmp_path, args):
    done = ccsup(*args, state_dir=tmp_path / "none")
    assert "not a valid float" not in done.stderr
    assert done.returncode in (0, 3), (
        done.stderr
    )  # parsed: then no supervisor (3) or an empty history


@pytest.mark.parametrize("option", ["--wait-timeout", "--timeout"])
def test_a_bad_duration_is_named(tmp_path, option):
    done = ccsup("run", option, "2 parsecs", "--", "true", state_dir=tmp_path)
    assert done.returncode == 2
    assert f"Invalid value for '{option}': '2 parsecs' is not a duration" in done.stderr


def test_global_options_work_after_the_subcommand(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    for argv in (["--state-dir", str(elsewhere), "ps"], ["ps", "--state-dir", str(elsewhere)]):
        done = ccsup(*argv, state_dir=tmp_path / "default")
        assert done.returncode == 3, done.stderr
        assert str(elsewhere) in done.stderr and "default" not in done.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text("[slots]\ncaps = { t = 0 }\n")
    for argv in (["--config", str(bad), "status"], ["status", "--config", str(bad)]):
        done = ccsup(*argv, state_dir=tmp_path)
        assert (done.returncode, done.stderr) == (
            2,
            f"ccsup: {bad}:2: slots.caps.t: a cap must be a whole number from 1 to 1000000, not 0\n",
        )
    checked = ccsup("config", "check", "--state-dir", str(elsewhere), state_dir=tmp_path)
    assert checked.returncode == 0, checked.stderr


def test_ps_key_keeps_the_keys_named_or_matched(cli_daemon):
    state_dir = cli_daemon(CONFIG)

    def keys_of(*args: str) -> set[str]:
        done = ccsup("ps", "--json", *args, state_dir=state_dir)
        assert done.returncode == 0, done.stderr
        return {t["key"] for t in json.loads(done.stdout)["slot_keys"]}  # each key tallied

    assert keys_of() == {"t", "o:a", "o:b"}
    assert keys_of("--key", "t") == {"t"}
    assert keys_of("--key", "o:*") == {"o:a", "o:b"}
    assert keys_of("--key", "t", "--key", "o:b") == {"t", "o:b"}
    table = ccsup("ps", "--key", "o:*", state_dir=state_dir).stdout
    assert [line.split()[0] for line in table.splitlines()[1:3]] == ["o:a", "o:b"]
    assert "\nt " not in table
    bad = ccsup("ps", "--key", "a b", state_dir=state_dir)
    assert bad.returncode == 2 and "--key" in bad.stderr


def test_history_on_a_fresh_state_dir_is_an_empty_table(tmp_path):
    table = ccsup("history", state_dir=tmp_path)
    assert (table.returncode, table.stderr) == (0, "")
    assert len(table.stdout.splitlines()) == 1  # the header alone
    assert table.stdout.split()[:4] == ["ID", "KEY", "HOLDER", "OUTCOME"]
    as_json = ccsup("history", "--json", state_dir=tmp_path)
    assert (as_json.returncode, as_json.stdout) == (0, "[]\n")


def test_bare_ccsup_prints_its_help_and_version_has_three_spellings(tmp_path):
    """`ccsup` alone is a request for help (exit 0, as docker and kubectl answer it); the version
    answers to `--version`, `-V` and `ccsup version` alike."""
    bare = ccsup(state_dir=tmp_path)
    assert bare.returncode == 0 and bare.stdout.startswith("Usage: ccsup [OPTIONS] [COMMAND]")
    versions = [ccsup(*args, state_dir=tmp_path) for args in (["--version"], ["-V"], ["version"])]
    assert [(v.returncode, v.stdout.split("\n")[0]) for v in versions] == [(0, "ccsup 0.1.0")] * 3


def test_metrics_json_and_a_web_help_that_says_what_the_page_needs(cli_daemon):
    state_dir = cli_daemon(CONFIG)
    assert ccsup("run", "--key", "t", "--", "true", state_dir=state_dir).returncode == 0
    done = ccsup("metrics", "--json", state_dir=state_dir)
    samples = json.loads(done.stdout)
    ended = [s for s in samples if s["name"] == "ccsup_turns_ended_total"]
    assert ended == [
        {"name": "ccsup_turns_ended_total", "labels": {"key": "t", "outcome": "ok"}, "value": 1.0}
    ]
    helped = ccsup("web", "--help", state_dir=state_dir).stdout
    assert all(w in helped for w in ("ccsup start", "[web] token", "not connected", "Ctrl-C"))
