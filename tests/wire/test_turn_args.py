"""A turn request's `env_replace`, `stdin` and `winsize`: checked, named when wrong."""

from __future__ import annotations

import pytest

from supervisor.wire.args import parse_turn
from supervisor.wire.protocol import ProtocolError

BASE = {"key": "codex", "argv": ["true"]}


def test_the_defaults_are_todays_a_pipe_and_the_supervisors_environment():
    args = parse_turn(BASE)
    assert (args.stdin, args.env_replace, args.winsize) == ("pipe", False, None)


def test_each_mode_and_a_whole_environment_are_taken():
    for mode in ("pipe", "null", "tty"):
        assert parse_turn({**BASE, "stdin": mode}).stdin == mode
    args = parse_turn({**BASE, "env": {"A": "1"}, "env_replace": True})
    assert (args.env, args.env_replace) == ({"A": "1"}, True)
    assert parse_turn({**BASE, "stdin": "tty", "winsize": [40, 120]}).winsize == (40, 120)


@pytest.mark.parametrize(
    "extra, says",
    [
        ({"stdin": "terminal"}, "'stdin' must be one of pipe, null, tty, not 'terminal'"),
        ({"stdin": 0}, "'stdin' must be one of pipe, null, tty, not 0"),
        ({"env_replace": "yes"}, "'env_replace' must be true or false"),
        ({"env_replace": True, "env": {"A": None}}, "no null values"),
        ({"stdin": "tty", "winsize": [0, 80]}, "'winsize' must be [rows, cols]"),
        ({"stdin": "tty", "winsize": [24]}, "'winsize' must be [rows, cols]"),
        ({"stdin": "tty", "winsize": [24, True]}, "'winsize' must be [rows, cols]"),
        ({"winsize": [24, 80]}, "it needs 'stdin': 'tty'"),
    ],
)
def test_a_wrong_value_is_a_bad_request_naming_the_field(extra, says):
    with pytest.raises(ProtocolError) as caught:
        parse_turn({**BASE, **extra})
    assert caught.value.code == "bad_request" and says in caught.value.message


def test_a_command_exec_would_refuse_with_e2big_is_a_bad_request_naming_size_and_limit():
    from supervisor.wire.args import MAX_ARG_BYTES

    assert parse_turn({**BASE, "argv": ["echo", "x" * MAX_ARG_BYTES]}).argv[1] == "x" * 131071
    with pytest.raises(ProtocolError) as caught:
        parse_turn({**BASE, "argv": ["echo", "é" * 70000]})
    assert (
        "argument 1 of 'argv' is 140,000 bytes; exec takes at most 131,071" in caught.value.message
    )
    with pytest.raises(ProtocolError) as caught:
        parse_turn({**BASE, "env": {"BIG": "x" * MAX_ARG_BYTES}})
    assert "the variable 'BIG' of 'env' is 131,075 bytes" in caught.value.message
    many = ["x" * 100_000] * 30  # each fits, all together do not (ARG_MAX)
    with pytest.raises(ProtocolError) as caught:
        parse_turn({**BASE, "argv": many})
    assert "'argv' and 'env' together are 3,000," in caught.value.message
