"""The hook while a supervisor restarts: guards waiting for adoption (a crash) or a start under way
are not "no supervisor": the hook waits for it and then queues (or refuses with "ccsup is
restarting"), never `when_down = "pass"`, which would run the command uncapped."""

from __future__ import annotations

import json
import os
import subprocess
import threading

from conftest import PYTHON, ROOT, wait_until

HOOK = [PYTHON, "-S", str(ROOT / "supervisor" / "agents" / "fast_hook.py"), "claude"]
CCSUP = [PYTHON, "-m", "supervisor"]


def payload(command: str, cwd: str) -> bytes:
    return json.dumps(
        {
            "session_id": "sess-restart",
            "cwd": cwd,
            "hook_event_name": "PreToolUse",
            "tool_name": "Bash",
            "tool_input": {"command": command},
        }
    ).encode()


def test_a_crash_gap_with_when_down_pass_never_runs_a_third_command_on_a_cap_2_key(
    daemon, state_dir, tmp_path
):
    d = daemon(caps="default = 2", adopt_within="60s")
    config = tmp_path / "ccsup.toml"
    config.write_text(d.config.read_text() + '\n[hooks]\nwhen_down = "pass"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCSUP_")}
    env.update(
        CCSUP_TEST_RUN=os.environ["CCSUP_TEST_RUN"],
        CCSUP_STATE_DIR=str(state_dir),
        CCSUP_CONFIG=str(config),
        CCSUP_HOOK_LOG=str(tmp_path / "hook.log"),
    )
    go = tmp_path / "go"
    holders = [
        subprocess.Popen(
            [
                *CCSUP,
                "run",
                "--",
                "sh",
                "-c",
                f"echo ready; while [ ! -e {go} ]; do sleep 0.05; done",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(2)
    ]
    hooks: list[subprocess.CompletedProcess] = []
    try:
        for holder in holders:
            assert holder.stdout.readline() == b"ready\n"  # both slots held
        d.kill()  # a crash: the guards keep both commands running, waiting for adoption
        made = tmp_path / "ran"
        command = f"make -s -f {tmp_path / 'build.mk'}"
        (tmp_path / "build.mk").write_text(f"all:\n\t@touch {made}\n")
        asking = threading.Thread(
            target=lambda: hooks.append(
                subprocess.run(
                    HOOK, input=payload(command, str(tmp_path)), env=env, capture_output=True
                )
            )
        )
        asking.start()  # the hook asks in the gap, before the next supervisor starts
        log = tmp_path / "hook.log"
        wait_until(
            lambda: not asking.is_alive() or (log.exists() and "restarting" in log.read_text()),
            30,
            0.02,
            "the hook to wait for the supervisor (or to answer)",
        )
        d.start()  # the next supervisor adopts both turns: the key is still full
        asking.join(60)
        [done] = hooks
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)["hookSpecificOutput"]
        # not passed (it would have run as a third command): queued behind the two, or refused
        assert out["permissionDecision"] == "deny", out
        reason = out["permissionDecisionReason"]
        assert "queued as " in reason or "ccsup is restarting" in reason, reason
        assert not made.exists()
    finally:
        go.write_text("")
        for holder in holders:
            holder.wait(60)
    if "queued as " in reason:  # the queued command runs once a slot frees, by itself
        turn_id = reason.split("queued as ")[1].split(",")[0]
        waited = subprocess.run([*CCSUP, "wait", turn_id], env=env, capture_output=True, timeout=60)
        assert waited.returncode == 0, waited.stderr
        assert made.exists()


def test_a_supervisor_gone_for_good_is_when_down_after_all(state_dir, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCSUP_")}
    env.update(
        CCSUP_TEST_RUN=os.environ["CCSUP_TEST_RUN"],
        CCSUP_STATE_DIR=str(state_dir),
        CCSUP_HOOK_LOG=str(tmp_path / "hook.log"),
        XDG_CONFIG_HOME=str(tmp_path / "xdg"),
    )
    done = subprocess.run(
        HOOK, input=payload("make -s", str(tmp_path)), env=env, capture_output=True, timeout=60
    )
    assert done.returncode == 0 and b"no supervisor is running" in done.stdout  # said once
    assert "no supervisor running" in (tmp_path / "hook.log").read_text()
