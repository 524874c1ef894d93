"""[limits.<key>]: parsed with key and line; where a controller is not delegated, `config check`
and `status` say so for each limit (never silently ignored). This machine delegates no controller
to its cgroup2 hierarchy, so enforcement itself is not exercised here (see docs/containment.md)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from supervisor import config as cfg
from supervisor.cli.config import config_group


def test_limits_parse_into_cgroup_files():
    text = '[limits.codex]\nmemory_max = "1GiB"\npids_max = 64\ncpu_max = "150%"\nscope = "key"\n'
    limits = cfg.parse(text, "t.toml").limits["codex"]
    assert (limits.memory_max, limits.pids_max, limits.cpu_max, limits.scope) == (
        1 << 30,
        64,
        150,
        "key",
    )
    assert limits.files() == {
        "memory.max": str(1 << 30),
        "pids.max": "64",
        "cpu.max": "150000 100000",
    }
    assert cfg.parse("", "t.toml").limits == {}


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('memory_max = "lots"', "memory_max"),
        ("pids_max = 0", "pids_max"),
        ('cpu_max = "2"', 'must be a percentage of one CPU like "200%"'),
        ('scope = "both"', 'must be "turn" or "key"'),
        ("nonsense = 1", "nonsense"),
    ],
)
def test_a_bad_limit_is_named_with_its_key_and_line(line, message):
    with pytest.raises(cfg.ConfigProblems) as info:
        cfg.parse(f"[limits.codex]\n{line}\n", "t.toml")
    (problem,) = info.value.problems
    assert problem.line == 2 and problem.key.startswith("limits.codex")
    assert message in str(problem)


def test_config_check_says_which_limits_are_not_enforced_here(tmp_path):
    config = tmp_path / "ccsup.toml"
    config.write_text('[guard]\ncgroup = "off"\n[limits.codex]\nmemory_max = "1GiB"\n')
    env = {"XDG_STATE_HOME": str(tmp_path / "state"), "CCSUP_STATE_DIR": None}  # not ~'s
    result = CliRunner().invoke(config_group, ["check", "--config", str(config)], env=env)
    assert result.exit_code == 0, result.output
    assert 'warning: limits.codex.memory_max: not enforced: [guard] cgroup = "off"' in result.output


def test_status_reports_each_limit_and_why_it_is_not_enforced(daemon):
    d = daemon(grace="300ms", extra="")
    d.config.write_text(d.config.read_text() + '[limits.codex]\npids_max = 32\ncpu_max = "50%"\n')
    d.stop()
    d.start()
    with d.client() as client:
        limits = client.status()["limits"]
    assert set(limits) == {"codex"}
    not_enforced = limits["codex"]["not_enforced"]
    assert set(not_enforced) | set(limits["codex"]["enforced"]) == {"pids_max", "cpu_max"}
    for name, why in not_enforced.items():
        assert "controller is not delegated" in why or "cgroup" in why, (name, why)


def test_start_says_which_limits_are_not_enforced(state_dir):
    config = state_dir / "ccsup.toml"
    config.write_text('[guard]\ncgroup = "off"\n[limits.codex]\npids_max = 8\n')
    base = [sys.executable, "-m", "supervisor", "--state-dir", str(state_dir), "--config"]
    started = subprocess.run([*base, str(config), "start"], capture_output=True, timeout=30)
    try:
        assert started.returncode == 0, started.stderr
        assert (
            b'warning: limits.codex.pids_max: not enforced: [guard] cgroup = "off"\n'
            in started.stderr
        )
    finally:
        subprocess.run([*base, str(config), "stop"], capture_output=True, timeout=30)
