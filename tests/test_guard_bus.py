"""The guard's bus hints (`--bus`): topics, bodies, and that zmq stays out of a bus-less guard."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from conftest import PYTHON

zmq = pytest.importorskip("zmq")


def test_hints_group_exited_gone_are_published(tmp_path, state_dir):
    endpoint = f"ipc://{state_dir}/bus-in"
    ctx = zmq.Context()
    # stands in for the supervisor's proxy: an XSUB bound at bus-in carrying a subscription
    sub = ctx.socket(zmq.XSUB)
    sub.bind(endpoint)
    sub.send(b"\x01guard.")
    try:
        script = "setsid sleep 300 & sleep 0.3; exit 5"  # a group of its own, seen by a scan
        proc = subprocess.Popen(
            [PYTHON, "-m", "guardd", "--record-dir", str(tmp_path), "--grace", "0.2",
             "--scan", "0.05", "--turn", "t1", "--bus", endpoint, "--", "sh", "-c", script])
        # Keep polling, as the proxy does: a bound socket attaches a new peer (and sends it the
        # subscription) only when its owner calls into it.
        got = {}
        deadline = time.monotonic() + 10
        while "gone" not in got and time.monotonic() < deadline:
            if sub.poll(10):
                topic, body = sub.recv_multipart()
                got[topic.decode().rsplit(".", 1)[1]] = (topic.decode(), json.loads(body))
        assert proc.wait(10) == 5
    finally:
        sub.close(0)
        ctx.term()
    (rec_path,) = tmp_path.glob("*.json")
    rec = json.loads(rec_path.read_text())
    assert set(got) == {"group", "exited", "gone"}
    for event, (topic, body) in got.items():
        assert topic == f"guard.t1.{event}"
        assert body["v"] == 1 and body["turn"] == "t1" and body["guard"] == rec["guard"]
        assert isinstance(body["ts"], float)
    assert got["exited"][1]["code"] == 5 and got["exited"][1]["signal"] is None
    assert got["gone"][1]["record"] == str(rec_path)
    (group,) = rec["groups"]
    assert {k: got["group"][1][k] for k in ("pgid", "leader_start")} == {
        "pgid": group["pgid"], "leader_start": group["leader_start"]}


def test_guard_without_bus_never_imports_zmq():
    code = ("import sys, guardd.__main__ as m\n"
            "rc = m.main(['--grace', '0.1', '--', 'true'])\n"
            "assert 'zmq' not in sys.modules and 'psutil' not in sys.modules, 'imported'\n"
            "sys.exit(rc)\n")
    assert subprocess.run([PYTHON, "-c", code], timeout=10).returncode == 0
