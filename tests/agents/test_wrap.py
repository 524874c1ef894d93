"""`ccsup wrap`: the real Claude Code (the pinned npm package, against a scripted provider on
127.0.0.1) run as a contained terminal turn in a tmux pane. Its Bash call, through the hook, runs
as a turn of its own key labelled with the wrapped session; when Claude Code exits, nothing it
started is left running, and an MCP server's setsid child that ignores SIGTERM is named in the
session turn's leftovers.

Claude Code runs with `-p` on the pane's terminal: its interactive screen first asks about the
theme, the folder's trust and the API key, and its answers to a scripted model would be keys
typed at those screens; `-p` runs the same session loop (hooks, MCP servers, the Bash tool) with
none of them. The terminal, exit status and containment are the `-t` turn's either way.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import textwrap
import uuid

import pytest
from conftest import PYTHON, wait_until
from npm_harness import process_gone
from test_claude import claude, install_hook, plain_make, sandbox  # noqa: F401  (fixtures)
from tmux_pane import Pane

from supervisor.agents.scripted import ScriptedProvider
from supervisor.history import db

PLANTED = "planted-mcp-child"
# An MCP-server-like program: it starts a child in a session of its own that ignores SIGTERM
# (as servers that outlive their harness do), says where it is, then answers MCP over stdio.
SERVER = textwrap.dedent(
    f"""
    import json, os, subprocess, sys
    child = subprocess.Popen(
        ["bash", "-c", 'trap "" TERM; exec -a {PLANTED} sleep 300'],
        start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    with open(sys.argv[1], "w") as f:
        f.write(str(child.pid))
    for line in sys.stdin:
        msg = json.loads(line)
        if "id" not in msg:
            continue
        if msg["method"] == "initialize":
            result = {{"protocolVersion": msg["params"]["protocolVersion"], "capabilities": {{}},
                      "serverInfo": {{"name": "planted", "version": "1"}}}}
        elif msg["method"] == "tools/list":
            result = {{"tools": []}}
        else:
            result = {{}}
        print(json.dumps({{"jsonrpc": "2.0", "id": msg["id"], "result": result}}), flush=True)
    """
)


@pytest.mark.timeout(240)
def test_wrapped_claude_code_its_hooked_bash_turn_and_its_leftovers(claude, sandbox):  # noqa: F811
    install_hook(sandbox)
    tmp = sandbox["tmp"]
    (tmp / "server.py").write_text(SERVER)
    child_file = tmp / "planted.pid"
    mcp = tmp / "mcp.json"
    mcp.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "planted": {
                        "command": PYTHON,
                        "args": [str(tmp / "server.py"), str(child_file)],
                    }
                }
            }
        )
    )
    command = plain_make(tmp, "hooked", "echo turn=${CCSUP_TURN:-none}")  # one plain command
    provider = ScriptedProvider([("Bash", {"command": command, "description": "tests"})])
    env = {**sandbox["env"], "ANTHROPIC_BASE_URL": provider.url, "PATH": os.environ["PATH"]}
    rc_file = tmp / "rc"
    wrapped = " ".join(
        [
            sys.executable,
            "-m",
            "supervisor",
            "wrap",
            str(claude),
            "-p",
            "'run it'",
            "--output-format",
            "json",
            "--model",
            "claude-sonnet-4-5",
            "--mcp-config",
            str(mcp),
        ]
    )
    pane = Pane(
        f"ccsup-wrap-{uuid.uuid4().hex[:8]}",
        f"cd {sandbox['work']} && {wrapped}; echo $? > {rc_file}; sleep 600",
        env,
    )
    planted = None
    try:
        wait_until(
            lambda: rc_file.exists() and rc_file.read_text().strip(),
            180,
            0.1,
            f"claude to exit; screen:\n{pane.screen()}",
        )
        assert rc_file.read_text().strip() == "0", pane.screen()
        assert '"is_error":false' in pane.screen().replace("\n", ""), pane.screen()
        planted = int(child_file.read_text())
        [seen] = provider.results
        hooked_id = re.search(r"turn=(\S+)", seen).group(1)
        assert hooked_id != "none", seen  # the Bash call ran inside a ccsup turn
        # the session's own turn: key "session", labelled claude-<hex>, its harness claude
        wait_until(
            lambda: any(r["key"] == "session" for r in db.query(sandbox["state_dir"])),
            15,
            0.05,
            "the session's turn in the history",
        )
        (session,) = [r for r in db.query(sandbox["state_dir"]) if r["key"] == "session"]
        label = session["holder"]["session"]
        assert (
            re.fullmatch(r"claude-[0-9a-f]{8}", label) and session["holder"]["harness"] == "claude"
        )
        assert session["outcome"] == "ok"
        hooked = db.show(sandbox["state_dir"], hooked_id)
        assert hooked["key"] == "default" and hooked["holder"]["session"] == label
        # nothing Claude Code started is left: the planted child was ended, and named
        assert process_gone(planted)
        names = [n["name"] for n in (session["leftovers"] or {}).get("names", [])]
        assert f"{PLANTED} 300" in names, session["leftovers"]
    finally:
        provider.close()
        pane.close()
        if planted and not process_gone(planted):
            os.kill(planted, signal.SIGKILL)


@pytest.mark.timeout(90)
def test_a_wrapped_session_says_nothing_of_itself_unless_it_waits(daemon, state_dir, tmp_path):
    """The screen is the program's own; only a session that waits for a slot of [wrap] key (cap
    1 here) says so, and its exit status is the program's."""
    d = daemon(start=False, caps="default = 1")
    d.config.write_text(d.config.read_text() + "\n[wrap]\ncap = 1\n")
    d.start()
    env = dict(os.environ, CCSUP_STATE_DIR=str(state_dir), CCSUP_CONFIG=str(d.config))
    env.pop("NO_COLOR", None)
    go = tmp_path / "go"
    wrap = " ".join([sys.executable, "-m", "supervisor", "wrap"])
    prog = (
        f"sh -c 'echo \"[$CCSUP_WRAP_SESSION]\"; while [ ! -e {go} ]; do sleep 0.05; done; exit 5'"
    )
    first = Pane(f"ccsup-w1-{uuid.uuid4().hex[:8]}", f"{wrap} {prog}; echo rc=$?; sleep 600", env)
    second = None
    try:
        wait_until(lambda: "[sh-" in first.screen(), 20, 0.05, "the first session")
        second = Pane(
            f"ccsup-w2-{uuid.uuid4().hex[:8]}",
            f"{wrap} sh -c 'echo second; exit 6'; echo rc=$?; sleep 600",
            env,
        )
        wait_until(lambda: "waiting for a slot of session" in second.screen(), 20, 0.05, "its wait")
        go.touch()
        wait_until(
            lambda: "rc=5" in first.screen(), 20, 0.05, f"the first to end: {first.screen()}"
        )
        wait_until(lambda: "rc=6" in second.screen(), 20, 0.05, f"the second: {second.screen()}")
        assert "second" in second.screen() and ": started" in second.screen()
        # nothing of ccsup on the first one's screen but, on a loaded machine, that it waited
        said = [line for line in first.screen().splitlines() if line.startswith("ccsup:")]
        assert all("waiting for a slot" in line or line.endswith(": started") for line in said)
    finally:
        first.close()
        if second is not None:
            second.close()
