"""The real agent harnesses from the npm registry, pinned, installed once into a cache folder
($CCSUP_NPM_CACHE, else ~/.cache/ccsup-ci/npm; .ci/run fills it): `harness_bin("claude")` is the
path of the harness's executable, or skips the test saying why (no npm, or the install failed).
Installs are one at a time (a lock file in the cache folder): the suite's workers may ask at once.

Every harness runs with a HOME of the test's own and only loopback providers: nothing here
reaches a real model provider.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from guardd import procs

PINNED = {
    "claude": ("@anthropic-ai/claude-code", "2.1.332"),
    "codex": ("@openai/codex", "0.171.0"),
    "opencode": ("opencode-ai", "1.18.33"),
}


def cache_dir() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ccsup-ci" / "npm"
    return Path(os.environ.get("CCSUP_NPM_CACHE") or default)


def installed_version(name: str) -> str | None:
    package, _ = PINNED[name]
    manifest = cache_dir() / "node_modules" / package / "package.json"
    if not manifest.exists():
        return None
    return json.loads(manifest.read_text()).get("version")


def harness_bin(name: str) -> Path:
    package, version = PINNED[name]
    path = cache_dir() / "node_modules" / ".bin" / name
    if installed_version(name) != version or not path.exists():
        npm = shutil.which("npm")
        if npm is None:
            pytest.skip(f"npm is not installed: cannot install {package}@{version}")
        cache_dir().mkdir(parents=True, exist_ok=True)
        with open(cache_dir() / ".install.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another test process installing: wait for it
            _install(npm, name)
    return path


def _install(npm: str, name: str) -> None:
    package, version = PINNED[name]
    path = cache_dir() / "node_modules" / ".bin" / name
    if installed_version(name) != version or not path.exists():
        done = subprocess.run(
            [
                npm,
                "install",
                "--no-audit",
                "--no-fund",
                "--prefix",
                str(cache_dir()),
                f"{package}@{version}",
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode != 0 or not path.exists():
            pytest.skip(f"unable to install {package}@{version} from npm: {done.stderr[-500:]}")


def opencode_plugin_deps() -> Path | None:
    """What OpenCode installs into a config folder that holds a plugin, installed once into the
    cache: package.json naming @opencode-ai/plugin at OpenCode's pinned version, its lock file and
    node_modules (64 MB). OpenCode in a fresh HOME installs it from npm at every start (about 10
    CPU-seconds, and the network); with these in the folder it installs nothing. None when npm or
    the install fails: OpenCode then does as it would for a user."""
    version = PINNED["opencode"][1]
    folder = cache_dir().parent / "opencode-config" / version
    if _plugin_version(folder) != version:
        npm = shutil.which("npm")
        if npm is None:
            return None
        folder.mkdir(parents=True, exist_ok=True)
        with open(cache_dir().parent / "opencode-config" / ".install.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another test process installing: wait for it
            if _plugin_version(folder) != version:
                (folder / "package.json").write_text(
                    json.dumps({"dependencies": {"@opencode-ai/plugin": version}}, indent=2) + "\n"
                )
                done = subprocess.run(
                    [npm, "install", "--no-audit", "--no-fund", "--prefix", str(folder)],
                    capture_output=True,
                    text=True,
                    timeout=600,
                )
                if done.returncode != 0 or _plugin_version(folder) != version:
                    return None
    return folder


def _plugin_version(folder: Path) -> str | None:
    manifest = folder / "node_modules" / "@opencode-ai" / "plugin" / "package.json"
    try:
        return json.loads(manifest.read_text()).get("version")
    except (OSError, ValueError):
        return None


def process_gone(pid: int) -> bool:
    """The process a harness's command started (announced by pid) has ended: no such pid, or a
    zombie (guardd.procs' reading of /proc/<pid>/stat)."""
    stat = procs.read_stat(pid)
    return stat is None or stat.state == "Z"


def plain_make(folder: Path, name: str, script: str) -> str:
    """`make -s -f <file>` running `script` (a shell script) as its recipe: one plain simple
    command the hook's rules take, whatever the script holds (a line of several commands is not
    approved by the hook, so a test that means "a hooked command" says it this way)."""
    sh = folder / f"{name}.sh"
    sh.write_text(script)
    mk = folder / f"{name}.mk"
    mk.write_text(f"all:\n\t@sh {sh}\n")
    return f"make -s -f {mk}"
