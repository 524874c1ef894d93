"""A turn's stdin modes on the direct start (the zygote's is what the daemon tests use): "tty"
gives CMD a controlling terminal of its own, sized as asked; "null" gives it /dev/null."""

from __future__ import annotations

import asyncio

import pytest

from supervisor.guards.handle import GuardSpec, start_guard


def spec(tmp_path, argv, **how) -> GuardSpec:
    return GuardSpec(
        "t1", argv, cwd=None, env={}, record_dir=tmp_path, grace=0.2, scan=1.0, bus=None, **how
    )


async def output_of(tmp_path, guard, stdin: bytes | None = None) -> tuple[int | None, bytes]:
    """Follow the guard to its end: its status and the bytes of its stdout log."""
    loop = asyncio.get_running_loop()
    ended = asyncio.Event()
    logs = tmp_path / "logs"
    logs.mkdir()
    guard.attach(loop, logs, on_output=lambda *a: None, on_exit=ended.set)
    if stdin is not None:
        guard.write_stdin(stdin)
    await asyncio.wait_for(ended.wait(), 20)
    status = guard.reap()
    guard.close()
    return status, (logs / "stdout.log").read_bytes()


def test_a_tty_turn_has_a_controlling_terminal_of_its_size_in_a_session_of_its_own(tmp_path):
    script = (
        "[ -t 0 ] && [ -t 1 ] && [ -t 2 ] && echo tty; stty size; "
        'ps -o sid= -o pgid= -p $$; echo "me $$"; read line; echo "got $line"'
    )
    guard = start_guard(spec(tmp_path, ["sh", "-c", script], stdin="tty", winsize=(33, 111)))
    status, out = asyncio.run(output_of(tmp_path, guard, stdin=b"hello\n"))
    assert status == 0, out
    lines = out.decode().replace("\r\n", "\n").splitlines()
    # (the pty echoes "hello" where it comes: it was typed before CMD ran)
    assert "tty" in lines and "33 111" in lines and "got hello" in lines
    (me,) = [line.split()[1] for line in lines if line.startswith("me ")]
    assert f"{me} {me}" in [" ".join(line.split()) for line in lines]  # sid, pgid: its own


def test_a_null_turn_reads_dev_null_and_takes_no_input(tmp_path):
    guard = start_guard(
        spec(tmp_path, ["sh", "-c", "wc -c; readlink /proc/self/fd/0"], stdin="null")
    )
    with pytest.raises(BrokenPipeError):
        guard.write_stdin(b"x")
    status, out = asyncio.run(output_of(tmp_path, guard))
    assert (status, out.split()) == (0, [b"0", b"/dev/null"])
