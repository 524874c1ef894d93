"""The supervisor's handle on a guard (supervisor.guards.handle): the order of its readiness and
its exit, whichever of its start pipe and its pidfd the event loop sees first."""

from __future__ import annotations

import asyncio
import os

import pytest

from supervisor.guards.handle import ForkedGuardProcess, _Pipes

pytestmark = pytest.mark.timeout(30)


def _exited_child() -> tuple[int, int, int]:
    """A child that has exited, its pidfd, and its status (reaped here, as the zygote would)."""
    pid = os.fork()
    if pid == 0:
        os._exit(7)
    pidfd = os.pidfd_open(pid)
    _, status = os.waitpid(pid, 0)
    return pid, pidfd, os.waitstatus_to_exitcode(status)


@pytest.mark.parametrize("status_first", [True, False], ids=["status-first", "pidfd-first"])
def test_a_forked_guard_that_ended_at_once_is_ready_before_it_is_over(tmp_path, status_first):
    """A guard the zygote reaped before its pidfd woke the loop, its start pipe unread: the turn
    is still said started (ready) before it is said ended, or it would stay granted for good."""
    pid, pidfd, status = _exited_child()
    ready_r, ready_w = os.pipe()
    os.close(ready_w)  # the guard's end, closed by its exit
    guard = ForkedGuardProcess(
        "t1", _Pipes(pid, -1, -1, -1), tmp_path, pidfd=pidfd, start=1, ready=ready_r
    )
    said: list[str] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        (tmp_path / "logs").mkdir()
        guard.attach(loop, tmp_path / "logs", on_output=lambda *a: None, on_exit=over)
        guard.when_ready(loop, lambda: said.append("ready"))
        if status_first:
            guard.status_reported(status)
            guard._on_pidfd()  # what the loop calls when it sees the pidfd first
        else:
            guard._on_pidfd()
            guard.status_reported(status)
        while "over" not in said:
            await asyncio.sleep(0.01)

    def over() -> None:
        said.append("over")
        guard.reap()
        guard.close()

    asyncio.run(asyncio.wait_for(main(), 10))
    assert said == ["ready", "over"]
    assert guard.returncode == 7
