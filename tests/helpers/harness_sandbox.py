"""What the tests of the real harnesses (test_claude, test_codex, test_opencode and their
neighbours) share: a sandbox (a supervisor with a cap-1 key, a HOME and a work folder of the test's
own, the environment with the user's provider keys taken out), the hook installed as a user
installs it, OpenCode's provider config and the environment that starts it cheaply, the scripted
`wait` step of a queued session, and the sampler that counts the commands running at once.

OpenCode's start is most of an OpenCode test's CPU (a Bun binary). In a fresh HOME whose config
folder holds a plugin (the hook's), OpenCode installs @opencode-ai/plugin there from npm at every
start: about 10 CPU-seconds of a 15 CPU-second session. `seed_opencode_config` puts a cached
install there first, and OpenCode installs nothing. Two switches cut the rest by about 40% without
touching what a test sees of the hook or MCP: `OPENCODE_MODELS_PATH` names an empty models
catalogue (OpenCode otherwise parses its bundled models.dev snapshot at every start; the tests'
provider is declared in full in opencode.json), and `BUN_JSC_useDFGJIT=0` keeps JavaScriptCore's
optimising tier off (a short run pays for compiling code it never runs long enough to gain from).
A test's own files are all under its tmp_path; the cached install is only read.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

from conftest import PYTHON
from npm_harness import opencode_plugin_deps, plain_make

from supervisor.agents.scripted import ScriptedProvider, Step

CCSUP = [PYTHON, "-m", "supervisor"]
MODELS = Path(__file__).with_name("opencode_models.json")


def make_sandbox(daemon, state_dir: Path, tmp_path: Path, strip: tuple[str, ...]) -> dict:
    """A supervisor (cap 1), a HOME and a work folder of the test's own, and the env: the
    caller's, without the variables starting with `strip` (a user's provider keys and the
    harness's own settings) or CCSUP_, pointing at that supervisor."""
    d = daemon(caps="default = 1")
    home = tmp_path / "home"
    home.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith((*strip, "CCSUP_"))}
    env.update(
        CCSUP_TEST_RUN=os.environ["CCSUP_TEST_RUN"],
        HOME=str(home),
        CCSUP_STATE_DIR=str(state_dir),
        CCSUP_CONFIG=str(d.config),
        CCSUP_HOOK_LOG=str(tmp_path / "hook.log"),
    )
    return {"env": env, "home": home, "work": work, "state_dir": state_dir, "tmp": tmp_path}


def install_hook(harness: str, settings: Path, env: dict) -> None:
    """`ccsup hook install <harness> --settings <settings>`, as a user runs it."""
    done = subprocess.run(
        [*CCSUP, "hook", "install", harness, "--settings", str(settings)],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr


def mcp_env(env: dict) -> dict:
    """The environment a test gives `ccsup mcp` in a harness's MCP config: its supervisor."""
    keys = ("CCSUP_STATE_DIR", "CCSUP_CONFIG", "CCSUP_TEST_RUN")
    return {**{k: env[k] for k in keys}, "CCSUP_MCP_BOUND": "1"}


def mcp_answer(output: str) -> dict:
    """The JSON answer of an MCP call as a harness gives it to the model: the first JSON object
    in it (Codex puts a header before it, Claude Code its reminders after it)."""
    return json.JSONDecoder().raw_decode(output[output.index("{") :])[0]


# The two switches that make OpenCode's start cheap (above).
OPENCODE_CHEAP = {"OPENCODE_MODELS_PATH": str(MODELS), "BUN_JSC_useDFGJIT": "0"}


def ran_then_waited(provider: ScriptedProvider, offered: object) -> dict:
    """The model's MCP `run` answered "running" or "queued" with the advice to call `wait`, and
    a later `wait` by the same id answered the end with the command's output (`via-mcp`); `offered`
    (the tools each request offered) is what a failure shows. Returns run's answer."""
    assert provider.results, offered
    first = mcp_answer(provider.results[0])
    assert first["state"] in ("running", "queued") and "call `wait`" in first["next"]
    ended = [mcp_answer(r) for r in provider.results[1:] if '"ended"' in r]
    assert ended and ended[0]["stdout_tail"] == "via-mcp\n" and ended[0]["id"] == first["id"]
    return first


def opencode_env(home: Path, tmp_path: Path) -> dict[str, str]:
    """OpenCode's part of a test's env: its config under `home` (its plugin's dependencies already
    there: `seed_opencode_config`), its cache under the test's tmp, no network fetches or updates,
    and the two switches that make its start cheap."""
    seed_opencode_config(home / ".config" / "opencode")
    return {
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(tmp_path / "opencode-cache"),
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        **OPENCODE_CHEAP,
    }


def seed_opencode_config(folder: Path) -> None:
    """Puts into OpenCode's config folder what OpenCode would install there itself once it holds
    a plugin (npm_harness.opencode_plugin_deps): copies of its two small JSON files (a file that
    is rewritten in place stays the test's own) and hard links to the cached node_modules, so a
    test pays neither the install nor a 64 MB copy (OpenCode only reads them: a test's run leaves
    the cached files unchanged; a copy where hard links cannot be made). Nothing when npm could
    not install them: OpenCode then installs them itself, as for a user."""
    folder.mkdir(parents=True, exist_ok=True)
    deps = opencode_plugin_deps()
    if deps is None:
        return
    for name in ("package.json", "package-lock.json"):
        shutil.copyfile(deps / name, folder / name)
    modules = folder / "node_modules"
    linked = subprocess.run(["cp", "-al", str(deps / "node_modules"), str(modules)], check=False)
    if linked.returncode != 0:
        shutil.rmtree(modules, ignore_errors=True)
        shutil.copytree(deps / "node_modules", modules, symlinks=True)


def opencode_config(config: Path, provider: ScriptedProvider, **more: Any) -> Path:
    """OpenCode's opencode.json in the `config` folder (XDG_CONFIG_HOME): the scripted provider
    as a custom Chat Completions provider, its model the default; `more` adds top-level keys."""
    path = config / "opencode" / "opencode.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "$schema": "https://opencode.ai/config.json",
                "provider": {
                    "scripted": {
                        "npm": "@ai-sdk/openai-compatible",
                        "name": "scripted",
                        "options": {"baseURL": f"{provider.url}/v1", "apiKey": "sk-scripted"},
                        "models": {"m": {"name": "m", "tool_call": True}},
                    }
                },
                "model": "scripted/m",
                "autoupdate": False,
                "share": "disabled",
                **more,
            }
        )
    )
    return path


def setsid_daemon(tmp: Path) -> tuple[str, Path]:
    """A plain hooked command that starts a daemon which leaves its session (setsid) and ignores
    SIGTERM, writes its pid to the returned file, then prints `turn=<CCSUP_TURN> in <cwd>`."""
    pidfile = tmp / "daemon.pid"
    command = plain_make(
        tmp,
        "daemon",
        f"setsid sh -c 'trap \"\" TERM; echo $$ > {pidfile}; while :; do sleep 1; done' "
        "</dev/null >/dev/null 2>&1 & "
        f"while [ ! -s {pidfile} ]; do sleep 0.05; done; echo turn=${{CCSUP_TURN:-none}} in $PWD",
    )
    return command, pidfile


QUEUED = re.compile(r"queued as ([0-9a-f]+).*?Run: (.*?) \(it waits", re.S)


def then_wait(tool: str, arg: str, **more: Any) -> Step:
    """The scripted step after a command: if the hook answered "queued", run the `wait` line it
    printed (with the harness's tool `tool`, the line in argument `arg`); else say done."""

    def step(results: list[str]):
        found = QUEUED.search(results[-1])
        return (tool, {arg: found.group(2), **more}) if found else None

    return step


class AtOnce:
    """Counts the scripted build commands running at once: each keeps a file named by its pid in
    `running` while it runs (`command`, a plain hooked `make`); `most` is the most seen together,
    sampled every 5 ms while the `with` block runs."""

    def __init__(self, tmp: Path):
        self.running = tmp / "running"
        self.running.mkdir()
        self.command = plain_make(
            tmp, "build", f"touch {self.running}/$$; sleep 1; rm {self.running}/$$; echo ran"
        )
        self.most = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.most = max(self.most, len(os.listdir(self.running)))
            self._stop.wait(0.005)

    def __enter__(self) -> AtOnce:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def run_all(procs: list[subprocess.Popen], timeout: float) -> list[tuple[str, str]]:
    """Each process's (stdout, stderr) once all have ended; any still running after `timeout`
    (or after a failure) is killed and reaped before this returns or raises."""
    try:
        return [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
