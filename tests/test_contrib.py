"""contrib/: the Node sidecar's own tests, the systemd notify protocol, and shell completion.

The Node tests run with node's test runner against a real supervisor that they start in a temporary
state directory (with this interpreter, through $CCSUP_PYTHON); they are skipped only where `node`
or the installed npm package (`npm ci` in contrib/node-sidecar, as .ci/run does) is missing.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time

import pytest

from conftest import PYTHON, ROOT, write_config

SIDECAR = ROOT / "contrib" / "node-sidecar"
NODE = shutil.which("node")


# -- the Node sidecar ------------------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_node_sidecar_tests_pass_against_a_real_supervisor():
    if NODE is None:
        pytest.skip("node is not installed: the Node sidecar's tests cannot run")
    if not (SIDECAR / "node_modules" / "zeromq").is_dir():
        pytest.skip(f"the zeromq npm package is not installed: run `npm ci` in {SIDECAR}")
    env = {**os.environ, "CCSUP_PYTHON": PYTHON}
    proc = subprocess.run([NODE, "--test", "test/sidecar.test.js"], cwd=SIDECAR, env=env,
                          capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert "# fail 0" in proc.stdout
