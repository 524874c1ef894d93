"""The page without a token is its owner's alone: another local uid, on loopback,
gets 403 for the page, a turn's output and cancel; the owner gets all three.

The other uid is real: curl run as uid 65534 (setpriv), as the issue's attack was."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import urllib.error
import urllib.request

import pytest
from conftest import PYTHON

OTHER = 65534
pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="running a client as another uid needs root"),
    pytest.mark.skipif(not shutil.which("setpriv") or not shutil.which("curl"), reason="setpriv"),
]


def as_other(*curl_args: str) -> tuple[int, str]:
    """curl as uid 65534: (HTTP status, body)."""
    result = subprocess.run(
        ["setpriv", "--reuid", str(OTHER), "--regid", str(OTHER), "--clear-groups"]
        + ["curl", "-s", "--max-time", "5", "-w", "\n%{http_code}", *curl_args],
        capture_output=True,
        text=True,
        timeout=15,
    )
    body, _, status = result.stdout.rpartition("\n")
    return int(status), body


def owner_get(url: str, until: str | None = None) -> tuple[int, str]:
    """GET as the owner: (status, body), a stream's body read only until it holds `until`."""
    request = urllib.request.Request(url)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            if until is None:
                return response.status, response.read().decode()
            body = ""
            while until not in body and (line := response.readline()):
                body += line.decode()
            return response.status, body
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.fixture
def page(daemon, state_dir):
    d = daemon(caps="codex = 1")
    proc = subprocess.Popen(
        [PYTHON, "-m", "supervisor", "--state-dir", str(state_dir), "--config", str(d.config)]
        + ["web", "--listen", "127.0.0.1:0"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    first = proc.stdout.readline()  # the handshake: printed once it listens
    assert first.startswith("ccsup web: serving "), first + proc.stdout.read()
    yield d, first.split()[3]
    proc.send_signal(signal.SIGTERM)
    proc.wait(10)
    proc.stdout.close()


def test_another_uid_on_loopback_gets_403_for_the_page_the_output_and_cancel(page, event_log):
    d, url = page
    log = event_log(d)
    with d.client() as client:
        client.turn("codex", ["sh", "-c", "echo the-owners-secret; exec sleep 60"], id="t1")
    log.wait_for("turn.t1.started")
    output = f"{url}api/turn/t1/output?stream=stdout"

    # The owner: the page, its CSRF token, the output.
    status, index = owner_get(url)
    assert status == 200
    csrf = re.search(r'name="ccsup-csrf" content="([^"]+)"', index).group(1)
    status, body = owner_get(output, until="the-owners-secret")
    assert status == 200 and "the-owners-secret" in body

    # Another uid: nothing, not even with the page's CSRF token in hand.
    for target in (url, output, f"{url}api/state", f"{url}api/turn/t1"):
        status, body = as_other(target)
        assert status == 403, (target, body)
        assert "the-owners-secret" not in body
        assert json.loads(body)["error"].startswith(f"this page is uid {os.geteuid()}'s alone")
    host = url.removeprefix("http://").rstrip("/")
    status, body = as_other(
        "-X", "POST", "-H", f"Origin: http://{host}", "-H", f"X-Ccsup-Csrf: {csrf}",
        f"{url}api/turn/t1/cancel",
    )  # fmt: skip
    assert status == 403, body
    with d.client() as client:
        assert next(s for s in client.ps()["slots"] if s["turn"] == "t1")["state"] == "held"
    assert "turn.t1.cancelled" not in log.topics("turn.t1.")

    # The owner's cancel still works.
    request = urllib.request.Request(
        f"{url}api/turn/t1/cancel",
        method="POST",
        headers={"Origin": f"http://{host}", "X-Ccsup-Csrf": csrf},
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 200
    log.wait_for("turn.t1.released")
