"""The configuration: parse (pure), every error kind with key and line, discovery, state dir,
the embedded and example files, and `ccsup config check|init`. No test reads the real home."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import click
import pytest
import zmq
from click.testing import CliRunner

from supervisor import config as cfg
from supervisor.caps import Caps
from supervisor.cli.config import config_group
from supervisor.config.admission import Rate
from supervisor.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
SRC = "/etc/x/ccsup.toml"
PUBLIC, SECRET = (k.decode() for k in zmq.curve_keypair())
CLIENT_PUBLIC, CLIENT_SECRET = (k.decode() for k in zmq.curve_keypair())
# A tcp control endpoint with the supervisor's pair; a test appends its client_keys lines.
TCP_CURVE = f"[endpoints]\ncontrol = 'tcp://127.0.0.1:5555'\n[endpoints.curve]\npublic_key = '{PUBLIC}'\nsecret_key = '{SECRET}'\n"


def problems_of(text: str, env=None) -> list[cfg.Problem]:
    with pytest.raises(cfg.ConfigProblems) as info:
        cfg.parse(text, SRC, env or {})
    assert info.value.exit_code == 2
    assert isinstance(info.value, ConfigError)
    return list(info.value.problems)


# ----------------------------------------------------------------------------- durations, sizes


@pytest.mark.parametrize(
    "value, seconds",
    [
        ("5s", 5.0),
        ("500ms", 0.5),
        ("2m", 120.0),
        ("1h", 3600.0),
        ("0.25s", 0.25),
        (".5s", 0.5),
        ("3", 3.0),
        ("1.5", 1.5),
        (" 10 s ", 10.0),
        ("20MS", 0.02),
        (7, 7.0),
        (0.2, 0.2),
    ],
)
def test_parse_duration_accepts(value, seconds):
    assert cfg.duration(value, where="guard.grace") == seconds


@pytest.mark.parametrize(
    "value, reason",
    [
        ("0s", "more than zero"),
        (0, "more than zero"),
        (-1, "more than zero"),
        ("-5s", "not a duration"),
        ("5 sec", "not a duration"),
        ("s", "not a duration"),
        ("", "not a duration"),
        ("1d", "not a duration"),
        ("inf", "not a duration"),
        (float("inf"), "more than zero"),
        (float("nan"), "more than zero"),
        (True, "not a boolean"),
        ([5], "not an array"),
        ({"s": 5}, "not a table"),
    ],
)
def test_parse_duration_refuses(value, reason):
    with pytest.raises(ConfigError) as info:
        cfg.duration(value, where="guard.grace")
    assert info.value.message.startswith("guard.grace: ")
    assert reason in info.value.message


@pytest.mark.parametrize(
    "value, size",
    [
        ("2GiB", 2 * 1024**3),
        ("512MiB", 512 * 1024**2),
        ("1G", 1024**3),
        ("1GB", 10**9),
        ("100k", 102400),
        ("100kB", 100_000),
        ("1Ki", 1024),
        ("1.5KiB", 1536),
        ("4096", 4096),
        ("10B", 10),
        ("1T", 1024**4),
        (0, 0),
        (123, 123),
        ("0", 0),
        (" 2 gib ", 2 * 1024**3),
    ],
)
def test_parse_size_accepts(value, size):
    assert cfg.size(value, where="slots.min_free_memory") == size


@pytest.mark.parametrize(
    "value, reason",
    [
        (-1, "negative"),
        ("-1G", "not a size"),
        ("1X", "not a size"),
        ("lots", "not a size"),
        ("", "not a size"),
        ("1 GiB extra", "not a size"),
        (1.5, "not a float"),
        (True, "not a boolean"),
        (["1G"], "not an array"),
    ],
)
def test_parse_size_refuses(value, reason):
    with pytest.raises(ConfigError) as info:
        cfg.size(value, where="slots.min_free_memory")
    assert info.value.message.startswith("slots.min_free_memory: ")
    assert reason in info.value.message


# ----------------------------------------------------------------------------- every error kind

ERRORS = [
    # (text, dotted key, line, fragment of the message)
    (
        "[slots]\ndefualt_cap = 2\n",
        "slots.defualt_cap",
        2,
        "unknown key (did you mean default_cap?)",
    ),
    ("colour = 1\n", "colour", 1, "unknown key"),
    ("\n[bogus]\nx = 1\n", "bogus", 2, "unknown key"),
    ('[guard]\ngrace = "5s"\nspeed = 1\n', "guard.speed", 3, "unknown key"),
    (
        f"[endpoints.curve]\npublic_key = '{PUBLIC}'\nsecret_key = '{SECRET}'\npublic = 'x'\n",
        "endpoints.curve.public",
        4,
        "unknown key",
    ),
    ("[harness.codex]\ncmd = ['codex']\n", "harness.codex.cmd", 2, "unknown key"),
    ("slots = 3\n", "slots", 1, "must be a table, not an integer"),
    ("[slots]\ncaps = [1]\n", "slots.caps", 2, "must be a table of key = cap, not an array"),
    ("harness = 'codex'\n", "harness", 1, "must be a table"),
    ("[slots]\ndefault_cap = 0\n", "slots.default_cap", 2, "whole number from 1 to 1000000, not 0"),
    (
        "[slots]\ndefault_cap = true\n",
        "slots.default_cap",
        2,
        "whole number from 1 to 1000000, not True",
    ),
    (
        "[slots]\ndefault_cap = 1.5\n",
        "slots.default_cap",
        2,
        "whole number from 1 to 1000000, not 1.5",
    ),
    (
        "[slots]\ndefault_cap = '2'\n",
        "slots.default_cap",
        2,
        "whole number from 1 to 1000000, not '2'",
    ),
    (
        "[slots]\nmachine_cap = -3\n",
        "slots.machine_cap",
        2,
        "whole number from 1 to 1000000, not -3",
    ),
    ("[slots]\nmachine_cap = 1000001\n", "slots.machine_cap", 2, "from 1 to 1000000, not 1000001"),
    ("[slots]\ndefault_cap = 2000000\n", "slots.default_cap", 2, "from 1 to 1000000, not 2000000"),
    ("slots.caps.a = 9223372036854775807\n", "slots.caps.a", 1, "from 1 to 1000000, not 922"),
    ("[slots]\nreservation_ttl = '0ms'\n", "slots.reservation_ttl", 2, "more than zero"),
    ("[slots]\nreservation_ttl = 'soon'\n", "slots.reservation_ttl", 2, "not a duration"),
    ("[slots]\nmin_free_memory = -1\n", "slots.min_free_memory", 2, "must not be negative"),
    ("[slots]\nmin_free_memory = '1 gallon'\n", "slots.min_free_memory", 2, "not a size"),
    (
        '[slots]\ncaps = { codex = 2, "opencode:xai" = 0 }\n',
        'slots.caps."opencode:xai"',
        2,
        "whole number from 1 to 1000000, not 0",
    ),
    (
        "# a comment\n\n[slots]\ndefault_cap = 1\ncaps = { codex = false }\n",
        "slots.caps.codex",
        5,
        "whole number from 1 to 1000000, not False",
    ),
    ('[slots.caps]\ncodex = 2\n"open code" = 1\n', 'slots.caps."open code"', 3, "bad cap key"),
    ('[slots]\ncaps = { "_machine" = 2 }\n', "slots.caps._machine", 2, "reserved"),
    ('[slots]\ncaps = { "a:b:c" = 2 }\n', 'slots.caps."a:b:c"', 2, "bad cap key"),
    ('[slots]\ncaps = { ".hidden" = 2 }\n', 'slots.caps.".hidden"', 2, "may start with '.'"),
    (f"[slots]\ncaps = {{ {'k' * 129} = 2 }}\n", "slots.caps." + "k" * 129, 2, "at most 128"),
    ("slots.caps.codex = 0\n", "slots.caps.codex", 1, "whole number from 1 to 1000000"),
    ("[slots]\ncaps.codex = 0\n", "slots.caps.codex", 2, "whole number from 1 to 1000000"),
    ("[guard]\ngrace = '0s'\n", "guard.grace", 2, "more than zero"),
    ("[guard]\nscan = true\n", "guard.scan", 2, "not a boolean"),
    ("[guard]\nscan = 1979-05-27\n", "guard.scan", 2, "not a date or time"),
    ("state_dir = 'relative/dir'\n", "state_dir", 1, "absolute path"),
    ("state_dir = 7\n", "state_dir", 1, "must be a string, not an integer"),
    ("state_dir = ''\n", "state_dir", 1, "must not be empty"),
    (
        "[endpoints]\ncontrol = 'tcp://127.0.0.1:5555'\n",
        "endpoints.control",
        2,
        "tcp:// endpoint is refused unless [endpoints.curve]",
    ),
    (
        "[endpoints]\nbus_out = 'tcp://*:6000'\n",
        "endpoints.bus_out",
        2,
        "refused unless [endpoints.curve]",
    ),
    (
        "[endpoints]\nbus_in = 'inproc://bus'\n",
        "endpoints.bus_in",
        2,
        "not an ipc:// or tcp:// endpoint",
    ),
    (
        "[endpoints]\nbus_in = '/tmp/sock'\n",
        "endpoints.bus_in",
        2,
        "not an ipc:// or tcp:// endpoint",
    ),
    ("[endpoints]\ncontrol = 'ipc://relative/sock'\n", "endpoints.control", 2, "absolute path"),
    ("[endpoints]\ncontrol = 'ipc://@abstract'\n", "endpoints.control", 2, "absolute path"),
    (
        f"[endpoints]\ncontrol = 'ipc:///{'d' * 120}'\n",
        "endpoints.control",
        2,
        "longer than 107 bytes",
    ),
    ("[endpoints]\ncontrol = 'tcp://host'\n", "endpoints.control", 2, "tcp://HOST:PORT"),
    ("[endpoints]\ncontrol = 'tcp://host:99999'\n", "endpoints.control", 2, "tcp://HOST:PORT"),
    ("[endpoints]\ncontrol = 5\n", "endpoints.control", 2, "must be a string"),
    (
        f"[endpoints.curve]\npublic_key = 'short'\nsecret_key = '{SECRET}'\n",
        "endpoints.curve.public_key",
        2,
        "40 Z85 characters",
    ),
    # Client keys: a tcp:// endpoint lets in only the listed clients, so the list must be there.
    (TCP_CURVE, "endpoints.curve.client_keys", 3, "needs the public keys of the clients"),
    (
        TCP_CURVE + "client_keys = []\n",
        "endpoints.curve.client_keys",
        6,
        "needs the public keys of the clients",
    ),
    (
        TCP_CURVE + f"client_secret_key = '{CLIENT_SECRET}'\n",
        "endpoints.curve.client_keys",
        3,
        "would let in anyone",
    ),
    (
        TCP_CURVE + f"client_keys = '{CLIENT_PUBLIC}'\n",
        "endpoints.curve.client_keys",
        6,
        "must be an array of public keys, not a string",
    ),
    (
        TCP_CURVE + "client_keys = ['short']\n",
        "endpoints.curve.client_keys",
        6,
        "entry 1: a CURVE key is 40 Z85",
    ),
    (
        TCP_CURVE + f"client_keys = [\n  '{CLIENT_PUBLIC}',\n  5,\n]\n",
        "endpoints.curve.client_keys",
        6,
        "entry 2: must be a string, not an integer",
    ),
    (
        TCP_CURVE + f"client_keys = ['{PUBLIC}']\nclient_secret_key = '{CLIENT_SECRET}'\n",
        "endpoints.curve.client_secret_key",
        7,
        f"its public key {CLIENT_PUBLIC} is not in client_keys",
    ),
    (
        TCP_CURVE + f"client_keys = ['{CLIENT_PUBLIC}']\nclient_secret_key = 'x'\n",
        "endpoints.curve.client_secret_key",
        7,
        "40 Z85 characters",
    ),
    (
        f"[endpoints.curve]\npublic_key = '{PUBLIC}'\nsecret_key = '{SECRET}'\nclient_keys = [1]\n",
        "endpoints.curve.client_keys",
        4,
        "entry 1: must be a string",
    ),
    (
        "[harness.codex]\ncommand = 'codex app-server'\n",
        "harness.codex.command",
        2,
        "array of strings",
    ),
    ("[harness.codex]\ncommand = []\n", "harness.codex.command", 2, "non-empty array"),
    (
        "[harness.codex]\ncommand = [\n  'codex',\n  3,\n]\n",
        "harness.codex.command",
        2,
        "array of strings",
    ),
    (
        "[harness.codex]\ndefault_cap = 0\n",
        "harness.codex.default_cap",
        2,
        "whole number from 1 to 1000000",
    ),
    ("[harness.codex]\ndefault_cap = 1000001\n", "harness.codex.default_cap", 2, "not 1000001"),
    (
        "[harness.a]\ndefault_cap = 2\n\n[harness.b]\ndefault_cap = 0\n",
        "harness.b.default_cap",
        5,
        "whole number from 1 to 1000000",
    ),
    (
        '[harness."opencode:xai"]\ndefault_cap = 2\n',
        'harness."opencode:xai"',
        1,
        "no :variant part",
    ),
    ("[harness._x]\n", "harness._x", 1, "reserved"),
    (
        "harness = { codex = { default_cap = 0 } }\n",
        "harness.codex.default_cap",
        1,
        "whole number from 1 to 1000000",
    ),
    # Lines inside a multi-line string are not keys.
    (
        '[harness.codex]\ncommand = ["""x\ndefault_cap = 0\n"""]\ndefault_cap = 0\n',
        "harness.codex.default_cap",
        5,
        "whole number from 1 to 1000000",
    ),
    (
        "[harness.codex]\ncommand = [\n'''\n[guard]\ngrace = 1\n''']\n[guard]\ngrace = true\n",
        "guard.grace",
        8,
        "not a boolean",
    ),
    (
        '[slots]\ndefault_cap = 1 # caps = 0\n\n[guard]\n"grace" = "never"\n',
        "guard.grace",
        5,
        "not a duration",
    ),
]


def _error_id(key: str, fragment: str) -> str:
    """The same in every process (xdist's workers must collect the same ids): no random key."""
    for name, value in {"PUBLIC": PUBLIC, "CLIENT_PUBLIC": CLIENT_PUBLIC}.items():
        fragment = fragment.replace(value, name)
    return f"{key}:{fragment[:20]}"


@pytest.mark.parametrize(
    "text, key, line, fragment", ERRORS, ids=[_error_id(e[1], e[3]) for e in ERRORS]
)
def test_each_error_names_file_key_and_line(text, key, line, fragment):
    (problem,) = problems_of(text)
    assert (problem.source, problem.key, problem.line) == (SRC, key, line)
    assert fragment in problem.message
    assert str(problem).startswith(f"{SRC}:{line}: {key}: ")


@pytest.mark.parametrize(
    "text, line, fragment",
    [
        ("[slots]\ndefault_cap = \n", 2, "Invalid value (at line 2"),
        ("[slots\n", 1, "at line 1"),
        ("a = 1\na = 2\n", 2, "at line 2"),
        ("[slots]\n\ncaps = { codex = 2,\n", 3, "at line 3"),
    ],
)
def test_syntax_error_gives_tomllib_message_and_line(text, line, fragment):
    (problem,) = problems_of(text)
    assert problem.line == line and problem.key is None
    assert problem.message.startswith("invalid TOML: ") and fragment in problem.message
    assert str(problem).startswith(f"{SRC}:{line}: invalid TOML: ")


def test_every_problem_is_reported_in_file_order():
    text = (
        "[guard]\n"  # 1
        "grace = '-'\n"  # 2
        "[slots]\n"  # 3
        "default_cap = 0\n"  # 4
        'caps = { codex = 2, "opencode:xai" = 0 }\n'  # 5
        "[endpoints]\n"  # 6
        "control = 'tcp://0.0.0.0:1'\n"  # 7
        "[bogus]\n"  # 8
    )
    problems = problems_of(text, {cfg.TTL_ENV: "soon"})
    assert [(p.line, p.key) for p in problems] == [
        (2, "guard.grace"),
        (4, "slots.default_cap"),
        (5, 'slots.caps."opencode:xai"'),
        (7, "endpoints.control"),
        (8, "bogus"),
        (None, "$CCSUP_RESERVATION_TTL_MS"),
    ]
    message = str(cfg.ConfigProblems(problems))
    assert len(message.splitlines()) == 6


# ----------------------------------------------------------------------------- good configs


def test_full_config_parses_to_exact_values():
    public, secret = (k.decode() for k in zmq.curve_keypair())
    text = f"""
state_dir = "~/state"
[slots]
default_cap = 2
reservation_ttl = "90s"
machine_cap = 6
min_free_memory = "512MiB"
caps = {{ codex = 3, "opencode:xai" = 1, opencode = 4 }}
[guard]
grace = "300ms"
scan = 1
[endpoints]
control = "tcp://127.0.0.1:7000"
bus_in = "ipc:///tmp/in"
[endpoints.curve]
public_key = "{public}"
secret_key = "{secret}"
client_keys = ["{CLIENT_PUBLIC}", "{PUBLIC}"]
client_secret_key = "{CLIENT_SECRET}"
[harness.codex]
command = ["codex", "app-server"]
default_cap = 2
[harness.claude]
"""
    config = cfg.parse(text, SRC, {"HOME": "/home/someone"})
    assert config == cfg.Config(
        source=SRC,
        state_dir=Path("/home/someone/state"),
        caps=Caps(
            2,
            {"codex": 3, "opencode:xai": 1, "opencode": 4},
            {"codex": 2, "session": 32},  # [wrap] cap, as the wrap key's harness default
            6,
            512 * 1024**2,
        ),
        reservation_ttl=90.0,
        grace=0.3,
        scan=1.0,
        endpoints=cfg.Endpoints(
            "tcp://127.0.0.1:7000",
            "ipc:///tmp/in",
            None,
            {
                "public_key": public,
                "secret_key": secret,
                "client_keys": [CLIENT_PUBLIC, PUBLIC],
                "client_secret_key": CLIENT_SECRET,
            },
        ),
        harness={
            "codex": cfg.Harness("codex", ["codex", "app-server"], 2),
            "claude": cfg.Harness("claude", None, None),
        },
    )
    assert config.caps.cap_for("opencode:abc") == 4 and config.caps.cap_for("codex:x") == 3
    assert config.caps.cap_for("claude") == 2


def test_empty_file_means_every_default():
    config = cfg.parse("", SRC)
    assert config == dataclasses.replace(cfg.parse(cfg.embedded_text(), SRC))
    assert (config.grace, config.scan, config.reservation_ttl) == (
        cfg.DEFAULT_GRACE,
        cfg.DEFAULT_SCAN,
        cfg.DEFAULT_RESERVATION_TTL,
    )
    assert config.caps == Caps(harness_default={"session": 32})  # [wrap] cap
    assert config.state_dir is None and config.harness == {}
    assert config.endpoints == cfg.Endpoints(None, None, None, None)


def test_curve_pair_must_match_and_be_complete():
    public, _ = (k.decode() for k in zmq.curve_keypair())
    _, other_secret = (k.decode() for k in zmq.curve_keypair())
    text = f"[endpoints]\ncontrol = 'tcp://127.0.0.1:1'\n[endpoints.curve]\npublic_key = '{public}'\nsecret_key = '{other_secret}'\n"
    (problem,) = problems_of(text + f"client_keys = ['{CLIENT_PUBLIC}']\n")
    assert (problem.key, problem.line) == ("endpoints.curve.public_key", 4)
    assert "not the public key of secret_key" in problem.message
    (problem,) = problems_of(f"[endpoints.curve]\npublic_key = '{public}'\n")
    assert (problem.key, problem.line) == (
        "endpoints.curve",
        1,
    ) and "secret_key is missing" in problem.message


def test_reservation_ttl_env_override():
    text = "[slots]\nreservation_ttl = '60s'\n"
    assert cfg.parse(text, SRC, {}).reservation_ttl == 60.0
    assert cfg.parse(text, SRC, {cfg.TTL_ENV: "1500"}).reservation_ttl == 1.5
    assert cfg.parse(text, SRC, {cfg.TTL_ENV: "250.5"}).reservation_ttl == 0.2505
    for bad in ("", "0", "-5", "1s", "nan", "inf"):
        (problem,) = problems_of(text, {cfg.TTL_ENV: bad})
        assert problem.key == "$CCSUP_RESERVATION_TTL_MS" and problem.line is None
        assert repr(bad) in problem.message


def test_endpoints_resolve_fills_defaults_in_the_state_dir(tmp_path):
    resolved = cfg.Endpoints(None, "ipc:///tmp/in", None, None).resolve(tmp_path)
    assert resolved == cfg.Endpoints(
        f"ipc://{tmp_path}/control", "ipc:///tmp/in", f"ipc://{tmp_path}/bus-out", None
    )
    with pytest.raises(
        ConfigError, match=r"endpoints.control: the ipc socket path .* longer than 107"
    ):
        cfg.Endpoints(None, None, None, None).resolve(Path("/" + "s" * 110))


# ----------------------------------------------------------------------------- shipped files


def test_embedded_default_is_the_commented_default_text():
    # supervisor/config/default.toml is generated from config.SECTIONS; regenerate it with
    # .venv/bin/python -c "from supervisor import config; print(config.default_config_text(), end='')" > supervisor/config/default.toml
    assert cfg.embedded_text() == cfg.default_config_text()
    config = cfg.parse(cfg.default_config_text(), cfg.EMBEDDED_SOURCE)
    assert config == cfg.Config(
        cfg.EMBEDDED_SOURCE,
        None,
        Caps(1, {}, {"session": 32}, None, None),
        60.0,
        5.0,
        2.0,
        cfg.Endpoints(None, None, None, None),
        {},
    )
    # Every key is explained by a comment right above it.
    lines = cfg.default_config_text().splitlines()
    for i, line in enumerate(lines):
        if re.match(r"(# )?[a-z_]+ = ", line):
            assert lines[i - 1].startswith("# ") and not re.match(r"# [a-z_]+ = ", lines[i - 1]), (
                line
            )


def test_commented_examples_in_the_default_are_valid_when_uncommented():
    text = cfg.default_config_text()
    # Uncomment every example except the CURVE placeholders (they are not keys, on purpose).
    uncommented = re.sub(
        r"^# ((?!\[endpoints\.curve\]|public_key|secret_key|client_keys|client_secret_key)(\[[a-z_.]+\]|[a-z_]+ = .*))$",
        r"\1",
        text,
        flags=re.M,
    )
    assert uncommented != text
    config = cfg.parse(uncommented, "uncommented", {"HOME": "/h"})
    assert config.state_dir == Path("/h/.local/state/ccsup")
    assert config.caps == Caps(
        1,
        {"codex": 2, "opencode:xai": 1, "opencode": 3, "claude:work": 1, "claude:home": 1},
        {"codex": 2, "session": 32},
        8,
        1024**3,
    )
    assert dict(config.pools.pools) == {"claude": ("claude:work", "claude:home")}
    assert config.harness["codex"].command == ["codex", "app-server"]
    assert config.endpoints.control == "ipc:///run/user/1000/ccsup/control"
    assert config.admission.rates["opencode:xai"] == Rate(3, 10.0)
    assert config.admission.max_runtime == {"codex": 7200.0}
    rule = config.admission.pause_on["codex"]
    assert (rule.exit_codes, rule.for_, rule.stderr.pattern) == (
        frozenset({75}),
        60.0,
        "(?i)rate.?limit|429",
    )


def test_example_conf_parses():
    path = ROOT / "conf" / "ccsup.toml"
    config = cfg.load(str(path), {"HOME": "/home/u"})
    assert config.source == str(path)
    assert config.state_dir == Path("/home/u/.local/state/ccsup")
    assert config.caps == Caps(
        1,
        {"codex": 2, "opencode:xai": 1, "opencode": 3, "claude:work": 1, "claude:home": 1},
        {"codex": 2, "claude": 3, "session": 32},
        8,
        1024**3,
    )
    assert (config.reservation_ttl, config.grace, config.scan) == (60.0, 5.0, 2.0)
    assert dict(config.pools.pools) == {"claude": ("claude:work", "claude:home")}
    assert config.pools.env["claude:home"]["CLAUDE_CONFIG_DIR"] == "/home/u/.claude-home"


# ----------------------------------------------------------------------------- discovery, loading


@pytest.fixture
def homes(tmp_path):
    """An isolated HOME and XDG config dir, and the env mapping that names them."""
    home, xdg = tmp_path / "home", tmp_path / "xdg"
    home.mkdir(), xdg.mkdir()
    return home, xdg, {"HOME": str(home), "XDG_CONFIG_HOME": str(xdg)}


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_discovery_order(homes, tmp_path):
    home, xdg, env = homes
    assert cfg.find_config_path(None, env) is None
    xdg_file = write(xdg / "ccsup" / "ccsup.toml", "")
    assert cfg.find_config_path(None, env) == xdg_file
    env_file = tmp_path / "env.toml"  # named by $CCSUP_CONFIG: returned even before it exists
    assert cfg.find_config_path(None, {**env, "CCSUP_CONFIG": str(env_file)}) == env_file
    cli_file = tmp_path / "cli.toml"
    assert cfg.find_config_path(str(cli_file), {**env, "CCSUP_CONFIG": str(env_file)}) == cli_file
    # Without XDG_CONFIG_HOME (or with a relative one, which the XDG spec says to ignore): ~/.config.
    assert cfg.find_config_path(None, {"HOME": str(home)}) is None
    home_file = write(home / ".config" / "ccsup" / "ccsup.toml", "")
    assert cfg.find_config_path(None, {"HOME": str(home)}) == home_file
    assert cfg.find_config_path(None, {"HOME": str(home), "XDG_CONFIG_HOME": "rel"}) == home_file
    assert cfg.find_config_path("~/x.toml", {"HOME": str(home)}) == home / "x.toml"
    assert (
        cfg.find_config_path(None, {"HOME": str(home), "CCSUP_CONFIG": "~/y.toml"})
        == home / "y.toml"
    )


def test_load_reads_the_found_file_or_the_embedded_defaults(homes, tmp_path):
    home, xdg, env = homes
    assert cfg.load(None, env).source == cfg.EMBEDDED_SOURCE
    write(xdg / "ccsup" / "ccsup.toml", "[slots]\ndefault_cap = 3\n")
    assert cfg.load(None, env).caps.default_cap == 3
    other = write(tmp_path / "o.toml", "[slots]\ndefault_cap = 4\n")
    assert cfg.load(None, {**env, "CCSUP_CONFIG": str(other)}).caps.default_cap == 4
    assert cfg.load(str(other), {**env, cfg.TTL_ENV: "10"}).reservation_ttl == 0.01


def test_load_errors_name_the_file(tmp_path):
    missing = tmp_path / "missing.toml"
    with pytest.raises(
        ConfigError, match=rf"unable to read config {re.escape(str(missing))}: No such file"
    ):
        cfg.load(str(missing), {})
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"a = '\xff'\n")
    with pytest.raises(ConfigError, match=r"bin.toml: not UTF-8"):
        cfg.load(str(binary), {})
    bad = write(tmp_path / "bad.toml", "\n[slots]\nmachine_cap = 0\n")
    with pytest.raises(cfg.ConfigProblems, match=rf"^{re.escape(str(bad))}:3: slots.machine_cap: "):
        cfg.load(str(bad), {})


def test_state_dir_resolution_order(tmp_path):
    home = tmp_path / "home"
    from_file = cfg.parse("state_dir = '~/from-file'", SRC, {"HOME": str(home)})
    none = cfg.parse("", SRC)
    env = {
        "HOME": str(home),
        "XDG_STATE_HOME": str(tmp_path / "xs"),
        "CCSUP_STATE_DIR": str(tmp_path / "e"),
    }
    assert cfg.resolve_state_dir(str(tmp_path / "c"), env, from_file) == tmp_path / "c"
    assert cfg.resolve_state_dir(None, env, from_file) == tmp_path / "e"
    del env["CCSUP_STATE_DIR"]
    assert cfg.resolve_state_dir(None, env, from_file) == home / "from-file"
    assert cfg.resolve_state_dir(None, env, none) == tmp_path / "xs" / "ccsup"
    del env["XDG_STATE_HOME"]
    assert cfg.resolve_state_dir(None, env, none) == home / ".local" / "state" / "ccsup"
    assert (
        cfg.resolve_state_dir(None, {**env, "XDG_STATE_HOME": "rel"}, none)
        == home / ".local/state/ccsup"
    )
    # Relative --state-dir is made absolute (ipc:// paths live in it); ~ is expanded.
    assert cfg.resolve_state_dir("rel", env, none) == Path(os.getcwd()) / "rel"
    assert cfg.resolve_state_dir("~/s", env, none) == home / "s"


# ----------------------------------------------------------------------------- the CLI


@pytest.fixture
def cli_env(tmp_path):
    home, xdg = tmp_path / "home", tmp_path / "xdg"
    return {
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(xdg),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "CCSUP_CONFIG": None,
        "CCSUP_STATE_DIR": None,
        cfg.TTL_ENV: None,
    }


def run(args, env):
    return CliRunner().invoke(config_group, args, env=env, catch_exceptions=False)


def test_check_ok_prints_source_and_caps(cli_env, tmp_path):
    result = run(["check", "--config", str(ROOT / "conf" / "ccsup.toml")], cli_env)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines()[0] == f"ok: {ROOT / 'conf' / 'ccsup.toml'}"
    assert (
        "  caps             claude:home=1, claude:work=1, codex=2, opencode=3, opencode:xai=1\n"
        in result.stdout
    )
    assert "  pool             claude = claude:work, claude:home\n" in result.stdout
    assert "  env              claude:work: CLAUDE_CONFIG_DIR\n" in result.stdout
    assert ".claude-work" not in result.stdout  # the values may be secrets
    assert "  harness caps     claude:*=3, codex:*=2, session:*=32\n" in result.stdout
    assert "machine_cap      8" in result.stdout
    assert "  min_free_memory  1073741824 bytes (1 GiB)\n" in result.stdout
    result = run(["check"], cli_env)  # nothing found: the embedded defaults
    assert result.exit_code == 0
    assert result.stdout.splitlines()[0] == "ok: <embedded defaults>"
    assert f"state_dir        {tmp_path / 'state' / 'ccsup'}" in result.stdout


def test_check_json(cli_env, tmp_path):
    import json

    path = write(tmp_path / "c.toml", "[slots]\ncaps = { codex = 2 }\n")
    result = run(["check", "--json", "--config", str(path)], cli_env)
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["source"] == str(path) and data["caps"] == {"codex": 2} and data["default_cap"] == 1
    assert data["endpoints"]["control"] == f"ipc://{tmp_path / 'state' / 'ccsup' / 'control'}"


def test_check_reports_every_error_and_exits_2(cli_env, tmp_path):
    path = write(
        tmp_path / "bad.toml",
        '[slots]\ndefault_cap = 0\ncaps = { codex = 2, "opencode:xai" = 0 }\n[guard]\ngrace = "5 parsecs"\n',
    )
    result = run(["check", "--config", str(path)], {**cli_env, cfg.TTL_ENV: "x"})
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"error: {path}:2: slots.default_cap: a cap must be a whole number from 1 to 1000000, not 0",
        f'error: {path}:3: slots.caps."opencode:xai": a cap must be a whole number from 1 to 1000000, not 0',
        f'error: {path}:5: guard.grace: \'5 parsecs\' is not a duration (write it like "5s", "500ms", "2m", "1h")',
        "error: environment: $CCSUP_RESERVATION_TTL_MS: must be a number of milliseconds > 0, not 'x'",
        f"4 problems in {path}",
    ]


def test_check_syntax_error_and_missing_file_exit_2(cli_env, tmp_path):
    path = write(tmp_path / "syntax.toml", "[slots]\ndefault_cap = = 1\n")
    result = run(["check", "--config", str(path)], cli_env)
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {path}:2: invalid TOML: ")
    result = run(["check", "--config", str(tmp_path / "nope.toml")], cli_env)
    assert result.exit_code == 2 and "unable to read config" in result.stderr


def test_check_uses_ccsup_config_and_the_parent_groups_options(cli_env, tmp_path):
    env_file = write(tmp_path / "env.toml", "[slots]\ndefault_cap = 5\n")
    result = run(["check"], {**cli_env, "CCSUP_CONFIG": str(env_file)})
    assert result.exit_code == 0 and result.stdout.startswith(f"ok: {env_file}\n")
    assert "default_cap      5" in result.stdout

    @click.group()
    @click.option("--state-dir", default=None)
    @click.option("--config", default=None)
    def main(state_dir, config):
        pass

    main.add_command(config_group)
    group_file = write(tmp_path / "group.toml", "[slots]\ndefault_cap = 7\n")
    result = CliRunner().invoke(
        main,
        ["--config", str(group_file), "--state-dir", str(tmp_path / "sd"), "config", "check"],
        env=cli_env,
    )
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"ok: {group_file}\n")
    assert f"state_dir        {tmp_path / 'sd'}" in result.output
    # The subcommand's own --config wins over the group's.
    result = CliRunner().invoke(
        main,
        ["--config", str(group_file), "config", "check", "--config", str(env_file)],
        env=cli_env,
    )
    assert result.output.startswith(f"ok: {env_file}\n")


def test_init_writes_the_commented_default_and_refuses_to_overwrite(cli_env, tmp_path):
    target = tmp_path / "xdg" / "ccsup" / "ccsup.toml"
    result = run(["init"], cli_env)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == f"wrote {target}\n"
    assert target.read_text() == cfg.default_config_text()
    assert target.stat().st_mode & 0o777 == 0o600
    written = cfg.load(
        None, {"HOME": cli_env["HOME"], "XDG_CONFIG_HOME": cli_env["XDG_CONFIG_HOME"]}
    )
    assert written.source == str(target)
    assert dataclasses.replace(written, source=cfg.EMBEDDED_SOURCE) == cfg.load(
        None, {"HOME": str(tmp_path / "none")}
    )

    target.write_text("# mine\n")
    result = run(["init"], cli_env)
    assert result.exit_code == 1
    assert (
        result.stderr
        == f"error: {target} already exists; not replacing it (use --force to overwrite)\n"
    )
    assert target.read_text() == "# mine\n"
    result = run(["init", "--force"], cli_env)
    assert result.exit_code == 0 and target.read_text() == cfg.default_config_text()
    assert [p.name for p in target.parent.iterdir()] == ["ccsup.toml"]  # no temporary file left


def test_init_path_option_and_unwritable_place(cli_env, tmp_path):
    target = tmp_path / "deep" / "er" / "c.toml"
    result = run(["init", "--path", str(target)], cli_env)
    assert result.exit_code == 0 and target.is_file()
    assert not (tmp_path / "xdg").exists()
    blocker = write(tmp_path / "file", "")
    result = run(["init", "--path", str(blocker / "c.toml")], cli_env)
    assert result.exit_code == 1 and result.stderr.startswith(
        f"error: unable to write config {blocker / 'c.toml'}: "
    )


def test_init_never_overwrites_a_file_that_appears_after_the_check(tmp_path, monkeypatch):
    from supervisor.cli import config as cli_config
    from supervisor.errors import CcsupError

    target = write(tmp_path / "c.toml", "# a racer's file\n")
    monkeypatch.setattr(cli_config.os.path, "lexists", lambda p: False)  # the check saw nothing
    with pytest.raises(CcsupError, match="already exists"):
        cli_config.write_default(target)
    monkeypatch.undo()
    assert target.read_text() == "# a racer's file\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.toml"]


def test_init_to_stdout_over_an_empty_file_and_on_a_fresh_home(cli_env, tmp_path):
    """What a new user types: `--path -` prints the default (no file named `-`); `init` on a fresh
    HOME makes the folders; a file left empty by a shell's redirect is filled, not refused."""
    result = run(["init", "--path", "-"], cli_env)
    assert (result.exit_code, result.stdout) == (0, cfg.default_config_text())
    assert not (Path.cwd() / "-").exists()
    target = tmp_path / "xdg" / "ccsup" / "ccsup.toml"
    assert not target.parent.exists()
    target.parent.mkdir(parents=True)
    target.write_text("")  # `ccsup config init > ~/.config/ccsup/ccsup.toml` left it empty
    result = run(["init"], cli_env)
    assert (result.exit_code, result.stdout) == (0, f"wrote {target}\n")
    assert target.read_text() == cfg.default_config_text()


def test_check_json_of_a_bad_file_prints_its_problems_on_stdout(cli_env, tmp_path):
    bad = write(tmp_path / "bad.toml", "[slots]\ndefault_cap = 0\n")
    result = run(["check", "--json", "--config", str(bad)], cli_env)
    assert result.exit_code == 2
    got = json.loads(result.stdout)
    assert got["ok"] is False and "default_cap" in got["problems"][0]
