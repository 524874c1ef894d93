"""Caps and cap keys, table by table: every form of the caps option and table, the bare-harness
fallback, the defaults, and each malformed item rejected with a message naming it."""

from __future__ import annotations

import json

import pytest

from supervisor.caps import (
    MACHINE_KEY,
    TAKEN,
    Caps,
    SlotState,
    check_caps_table,
    check_key,
    key_problem,
    parse_caps_option,
)
from supervisor.errors import UsageError
from supervisor.slots.record import SlotView

# ---- the command-line form ----------------------------------------------------------------------

OPTION_OK = [
    ("codex=2", {"codex": 2}),
    ("codex=2,opencode:xai=1", {"codex": 2, "opencode:xai": 1}),
    (" codex = 2 , opencode:xai=1 ", {"codex": 2, "opencode:xai": 1}),
    ("opencode=3", {"opencode": 3}),
    ("codex=2,", {"codex": 2}),  # a trailing comma is harmless
    ("", {}),
    ("a.b_c-d:e.f_g-h=10", {"a.b_c-d:e.f_g-h": 10}),
    ("k" * 128 + "=1", {"k" * 128: 1}),
]


@pytest.mark.parametrize("text,expected", OPTION_OK)
def test_caps_option_parses(text, expected):
    assert parse_caps_option(text) == expected


OPTION_BAD = [
    ("codex", "bad caps item 'codex': write it as key=N"),
    ("=2", "bad caps item '=2': write it as key=N"),
    ("codex=", "bad caps item 'codex=': write it as key=N"),
    ("codex=two", "bad caps item 'codex=two': 'two' is not a whole number"),
    ("codex=1.5", "bad caps item 'codex=1.5': '1.5' is not a whole number"),
    ("codex=2_0", "bad caps item 'codex=2_0': '2_0' is not a whole number"),
    ("codex=+2", "bad caps item 'codex=+2': '+2' is not a whole number"),
    ("codex=\u0663", "bad caps item 'codex=\u0663': '\u0663' is not a whole number"),
    ("codex==2", "bad caps item 'codex==2': '=2' is not a whole number"),
    ("codex=0", "bad cap for 'codex': 0 must be at least 1"),
    ("codex=-1", "bad cap for 'codex': -1 must be at least 1"),
    # B9: a cap over MAX_CAP (one of 10**20 grew the daemon to 3.5 GiB), named with its key
    ("codex=1000001", "bad cap for 'codex': 1000001 is over the maximum cap, 1000000"),
    ("a=99999999999999999999", "bad cap for 'a': 99999999999999999999 is over the maximum cap"),
    ("a=" + "9" * 5000, "bad cap for 'a': 9999"),  # int() alone refuses over 4300 digits
    ("codex=1,codex=2", "bad caps item 'codex=2': 'codex' is given twice"),
    ("codex=2,opencode:=1", "bad cap key 'opencode:'"),
    ("opencode:*=1", "bad cap key 'opencode:*'"),
    (":xai=1", "bad cap key ':xai'"),
    ("opencode:xai:beta=1", "bad cap key 'opencode:xai:beta'"),
    ("_machine=1", "bad cap key '_machine': keys starting with '_' are reserved"),
    ("_x=1", "bad cap key '_x': keys starting with '_' are reserved"),
    (".hidden=1", "bad cap key '.hidden': no part of a cap key may start with '.'"),
    ("codex:..=1", "bad cap key 'codex:..': no part of a cap key may start with '.'"),
    ("a b=1", "bad cap key 'a b'"),
    ("a/b=1", "bad cap key 'a/b'"),
    ("k" * 129 + "=1", "a cap key is at most 128 characters (this one has 129)"),
]


@pytest.mark.parametrize("text,message", OPTION_BAD)
def test_caps_option_rejects_naming_the_item(text, message):
    with pytest.raises(UsageError) as err:
        parse_caps_option(text)
    assert message in err.value.message
    assert err.value.exit_code == 2


# ---- the TOML table form ------------------------------------------------------------------------


def test_caps_table_accepts_keys_and_bare_harnesses():
    table = {"codex": 2, "opencode:xai": 1, "opencode": 3}
    assert check_caps_table(table) == table


TABLE_BAD = [
    ([("codex", 2)], "caps must be a table of key = cap"),
    ({"codex": 2.0}, "bad cap for 'codex': 2.0 is not a whole number"),
    ({"codex": "2"}, "bad cap for 'codex': '2' is not a whole number"),
    ({"codex": True}, "bad cap for 'codex': True is not a whole number"),
    ({"codex": 0}, "bad cap for 'codex': 0 must be at least 1"),
    ({"opencode": {"xai": 1}}, "bad cap for 'opencode': {'xai': 1} is not a whole number"),
    ({"opencode:*": 1}, "bad cap key 'opencode:*'"),
    ({"_machine": 4}, "bad cap key '_machine': keys starting with '_' are reserved"),
    ({"": 1}, "bad cap key '': a cap key must not be empty"),
]


@pytest.mark.parametrize("table,message", TABLE_BAD)
def test_caps_table_rejects_naming_the_item(table, message):
    with pytest.raises(UsageError) as err:
        check_caps_table(table)
    assert message in err.value.message


# ---- which cap a key gets -----------------------------------------------------------------------

CAPS = Caps(
    default_cap=1,
    caps={"codex": 2, "opencode:xai": 1, "opencode": 3, "claude:opus": 5},
    harness_default={"claude": 4, "opencode": 7, "gemini": 6},
    machine_cap=8,
)

CAP_FOR = [
    ("codex", 2),  # named
    ("opencode:xai", 1),  # named, wins over the bare harness
    ("opencode", 3),  # the bare harness itself
    ("opencode:grok", 3),  # fallback: bare harness named in caps, wins over harness default 7
    ("opencode:a.b-c_d", 3),
    ("codex:mini", 2),  # fallback from the bare `codex`
    ("claude:opus", 5),  # named
    ("claude:sonnet", 4),  # harness default_cap
    ("claude", 4),
    ("gemini:pro", 6),
    ("unknown", 1),  # global default
    ("unknown:variant", 1),
    (MACHINE_KEY, 8),
]


@pytest.mark.parametrize("key,cap", CAP_FOR)
def test_cap_for(key, cap):
    assert CAPS.cap_for(key) == cap


def test_global_default_cap_is_used_when_nothing_names_the_key():
    assert Caps(default_cap=3).cap_for("x:y") == 3
    assert Caps().cap_for("x") == 1


def test_a_variant_never_falls_back_to_another_variant():
    caps = Caps(caps={"opencode:xai": 5})
    assert caps.cap_for("opencode:grok") == 1
    assert caps.cap_for("opencode") == 1


def test_machine_cap_absent_is_an_error_and_not_configured():
    caps = Caps(caps={"codex": 2})
    with pytest.raises(KeyError):
        caps.cap_for(MACHINE_KEY)
    assert caps.configured_keys() == ["codex"]
    assert CAPS.configured_keys() == [
        "codex",
        "opencode:xai",
        "opencode",
        "claude:opus",
        MACHINE_KEY,
    ]


def test_with_caps_lets_the_command_line_win_and_keeps_the_rest():
    merged = CAPS.with_caps(parse_caps_option("codex=9,opencode:grok=2"))
    assert merged.cap_for("codex") == 9
    assert merged.cap_for("opencode:grok") == 2
    assert merged.cap_for("opencode:other") == 3
    assert merged.cap_for("claude:sonnet") == 4
    assert merged.machine_cap == 8
    assert CAPS.cap_for("codex") == 2  # the original is unchanged


def test_caps_are_read_only():
    with pytest.raises(TypeError):
        CAPS.caps["codex"] = 5  # type: ignore[index]


# ---- keys ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["codex", "opencode:xai", "a", "A.b-c_9:x", "k" * 128])
def test_good_keys(key):
    assert key_problem(key) is None
    assert check_key(key) == key


def test_machine_key_is_reserved_unless_allowed():
    assert key_problem(MACHINE_KEY) == "keys starting with '_' are reserved"
    assert key_problem(MACHINE_KEY, reserved_ok=True) is None
    assert key_problem("_other", reserved_ok=True) == "keys starting with '_' are reserved"


@pytest.mark.parametrize(
    "key,problem",
    [
        (None, "a cap key must be a string, not NoneType"),
        (3, "a cap key must be a string, not int"),
        ("", "a cap key must not be empty"),
        (
            "a:b:c",
            "a cap key is `harness` or `harness:variant` of letters, digits, '.', '_' and '-'",
        ),
        ("a\n", "a cap key is `harness` or `harness:variant` of letters, digits, '.', '_' and '-'"),
        ("..", "no part of a cap key may start with '.'"),
        ("k" * 129, "a cap key is at most 128 characters (this one has 129)"),
    ],
)
def test_bad_keys(key, problem):
    assert key_problem(key) == problem
    with pytest.raises(UsageError):
        check_key(key)


def test_slot_states_are_named_once_and_read_as_their_plain_strings():
    """The slot states are one StrEnum: ps --json, ps's text and the metrics see the same strings
    as before, and a state read back from JSON is the member itself."""
    assert [state.value for state in SlotState] == [
        "free",
        "reserved",
        "held",
        "orphaned",
        "unreadable",
    ]
    assert sorted(TAKEN) == sorted(set(SlotState) - {SlotState.FREE})
    view = SlotView("codex", 0, 2, SlotState.ORPHANED, turn="t1")
    body = json.dumps(view.to_json())
    assert '"state": "orphaned"' in body
    assert SlotState(json.loads(body)["state"]) is SlotState.ORPHANED
    assert f"{view.state:<10}|" == "orphaned  |"
