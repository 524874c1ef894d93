"""Leftovers named: what of a turn's tree still runs when its command exits is written into the
guard's record (`leftovers`: count, and the first 100 named) before the guard ends it."""

from __future__ import annotations

import os
import signal

from guard_run import PYTHON, GuardRun, gone, py

from guardd import leftovers, procs

NAME = f"{os.path.basename(PYTHON)} guard_cmds.py"


def test_a_setsid_child_that_outlives_its_command_is_named(tmp_path):
    g = GuardRun(tmp_path, py("setsid-child", "0"))
    try:
        child, child_pgid = g.announced("child")
        g.announced("ready")
        assert g.wait() == 0
        assert gone(child)
        left = g.record()["leftovers"]
        assert left["count"] == 1
        (named,) = left["names"]
        assert named["pid"] == child.pid and named["pgid"] == child_pgid == child.pid
        assert named["name"] == NAME and named["comm"].startswith("python")
        assert named["argv"][1:] == [py("x")[1], "setsid-child"]
        assert 0 <= named["ran_s"] < 60
    finally:
        g.close()


def test_a_command_that_leaves_nothing_has_no_leftovers(tmp_path):
    g = GuardRun(tmp_path, ["sh", "-c", "sleep 0.01 & wait"])
    assert g.wait() == 0
    assert "leftovers" not in g.record()


def test_a_stopped_turn_names_what_outlived_its_command(tmp_path):
    g = GuardRun(tmp_path, py("setsid-child", "stay"))
    try:
        child, _ = g.announced("child")
        g.announced("ready")
        g.proc.send_signal(signal.SIGTERM)  # a cancel: CMD ends at SIGTERM, its child ignores it
        assert g.wait() == 128 + signal.SIGTERM
        assert gone(child)
        left = g.record()["leftovers"]
        assert [(n["pid"], n["name"]) for n in left["names"]] == [(child.pid, NAME)]
        assert left["count"] == 1
    finally:
        g.close()


def test_at_most_a_hundred_are_named_and_all_are_counted(tmp_path):
    g = GuardRun(tmp_path, py("tree", "3", "4", "exit"), grace=2.0)
    try:
        while g.line()[0] != "ready":
            pass
        assert g.wait(60) == 0
        left = g.record()["leftovers"]
        # 3 + 9 + 27 + 81 nodes, less the 9 parents of leaves that exit once their leaves are up
        assert left["count"] == 111
        assert len(left["names"]) == leftovers.LIMIT
        assert {n["name"] for n in left["names"]} == {NAME}
    finally:
        g.close()


def test_names():
    assert leftovers.name_of("opencode", ["/usr/bin/opencode", "serve", "--port"]) == (
        "opencode serve"
    )
    assert (
        leftovers.name_of("python3", ["python3", "-m", "mcp_server_git"])
        == "python3 mcp_server_git"
    )
    assert leftovers.name_of("node", ["node", "/srv/mcp/dist/index.js"]) == "node index.js"
    assert leftovers.name_of("sleep", ["sleep"]) == "sleep"
    assert leftovers.name_of("sh", ["/bin/sh", "-c", "sleep 1; x/y"]) == "sh"
    assert len(leftovers.name_of("x", ["y" * 500])) == leftovers.MAX_NAME
    assert leftovers.name_of("kworker", []) == "kworker"
    assert procs.command_of(2**22 + 7) is None
