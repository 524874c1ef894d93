"""A released ccsup of an older commit, installed into a venv of its own (tests/system/
test_upgrade.py): built once from `git archive <commit>` with pip (not editable: the old code
must not see this tree), cached between runs under $XDG_CACHE_HOME/ccsup-ci/old-<commit> (else
~/.cache), keyed by the full commit and the Python that built it. A pytest that cannot have it
(no git history, as a shallow checkout; pip unable to install) skips, saying why.

Everything the old release runs is started with its own `ccsup` script (which puts no working
directory on sys.path) and from a working directory outside this tree, so neither the old
supervisor nor its zygote and guards (`python -m guardd...` from their own venv) import this
tree's code.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "ccsup-ci"


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, timeout=60)


def venv_of(commit: str) -> Path:
    """The venv of `commit`, built now if the cache has none; pytest.skip when it cannot be."""
    if shutil.which("git") is None:
        pytest.skip("no git: the old release is built from this repository's history")
    found = _git("rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}")
    if found.returncode != 0:
        pytest.skip(
            f"commit {commit} is not in this checkout's history (a shallow clone?): "
            "the upgrade from it cannot be tested"
        )
    full = found.stdout.decode().strip()
    python = f"py{sys.version_info.major}{sys.version_info.minor}"
    home = cache_root() / f"old-{full[:12]}-{python}"
    done = home / "built"  # written last: a build killed half-way is started again
    venv = home / "venv"
    if done.exists():
        return venv
    cache_root().mkdir(parents=True, exist_ok=True)
    with open(cache_root() / f".old-{full[:12]}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another pytest building it: wait for its venv
        if done.exists():
            return venv
        shutil.rmtree(home, ignore_errors=True)
        source = home / "src"
        source.mkdir(parents=True)
        archive = subprocess.run(
            f"git -C '{ROOT}' archive {full} | tar -x -C '{source}'",
            shell=True,
            capture_output=True,
            timeout=120,
        )
        if archive.returncode != 0:
            pytest.skip(f"unable to unpack commit {commit}: {archive.stderr.decode()[-500:]}")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
        pip = subprocess.run(
            [
                str(venv / "bin" / "pip"),
                "install",
                "-q",
                "--disable-pip-version-check",
                str(source),
            ],
            capture_output=True,
            timeout=600,
        )
        if pip.returncode != 0:
            pytest.skip(
                f"unable to install commit {commit} into a venv (pip exited {pip.returncode}): "
                f"{pip.stderr.decode()[-800:]}"
            )
        done.write_text(full + "\n")
    return venv


def environment(state_dir: Path) -> dict[str, str]:
    """The old release's environment: this one's (the test run's marker included), with nothing
    that points at this tree."""
    env = dict(os.environ)
    for name in ("PYTHONPATH", "CCSUP_CONFIG", "CCSUP_STATE_DIR", "VIRTUAL_ENV"):
        env.pop(name, None)
    env["XDG_CONFIG_HOME"] = str(state_dir / "no-config")
    return env


# One control call through the old release's own client: what its users' programs send.
_CALL = """
import json, sys
from supervisor.client import Client
state_dir, cmd, args = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
with Client(state_dir, timeout=10) as client:
    print(json.dumps(client.call(cmd, **args)))
"""


class OldRelease:
    """The old release's programs on one state directory and config."""

    def __init__(self, venv: Path, state_dir: Path, config: Path):
        self.venv, self.state_dir, self.config = venv, state_dir, config

    def command(self, *args: str) -> list[str]:
        return [
            str(self.venv / "bin" / "ccsup"),
            "--state-dir",
            str(self.state_dir),
            "--config",
            str(self.config),
            *args,
        ]

    def start_foreground(self, stderr_path: Path) -> subprocess.Popen:
        with open(stderr_path, "ab") as err:
            return subprocess.Popen(
                self.command("start", "--foreground"),
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=err,
                cwd=self.state_dir,
                env=environment(self.state_dir),
                start_new_session=True,
            )

    def ccsup(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.command(*args),
            capture_output=True,
            text=True,
            cwd=self.state_dir,
            env=environment(self.state_dir),
            timeout=timeout,
        )

    def call(self, cmd: str, **args) -> dict:
        """A control request through the old client; its result, or AssertionError."""
        done = subprocess.run(
            [
                str(self.venv / "bin" / "python"),
                "-c",
                _CALL,
                str(self.state_dir),
                cmd,
                json.dumps(args),
            ],
            capture_output=True,
            text=True,
            cwd=self.state_dir,
            env=environment(self.state_dir),
            timeout=30,
        )
        assert done.returncode == 0, f"the old client's {cmd!r}: {done.stderr[-1500:]}"
        return json.loads(done.stdout)
