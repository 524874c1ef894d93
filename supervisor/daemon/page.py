"""`[web] listen`: the daemon runs `ccsup web` beside itself, as a child process it starts and ends.

The page stays out of the daemon's process (aiohttp is never imported there, and a fault in the
page cannot stop a turn from being confirmed gone). The daemon starts it once it serves, and
ends it (SIGTERM, then SIGKILL after STOP_GRACE) once every turn is confirmed gone at shutdown.
If the daemon dies outright, the child sees its parent gone (a pidfd, `--exit-with-parent`) and
ends itself. The child's output goes to <state>/web.log (truncated at each start), so its
"serving" line and any failure to listen can be read there. A page that dies is not restarted:
`web.log` says why, and the turns go on.

Knows processes and files; nothing of HTTP.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from pathlib import Path

log = logging.getLogger("ccsup.web")

STOP_GRACE = 3.0
LOG_NAME = "web.log"


def start(state_dir: Path, config_path: str | None) -> subprocess.Popen:
    argv = [sys.executable, "-m", "supervisor", "--state-dir", str(state_dir)]
    if config_path:
        argv += ["--config", config_path]
    argv += ["web", "--exit-with-parent"]
    log_path = Path(state_dir) / LOG_NAME
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, start_new_session=True
        )
    finally:
        os.close(fd)
    log.info("started the web page (pid %d), see %s", proc.pid, log_path)
    return proc


async def stop(proc: subprocess.Popen) -> None:
    """End the page's process and reap it, without blocking the loop."""
    if proc.poll() is None:
        proc.terminate()
    loop = asyncio.get_running_loop()
    try:
        code = await asyncio.wait_for(loop.run_in_executor(None, proc.wait), STOP_GRACE)
    except TimeoutError:
        log.warning("the web page (pid %d) did not end in %.0f s: SIGKILL", proc.pid, STOP_GRACE)
        proc.kill()
        code = await loop.run_in_executor(None, proc.wait)
    log.info("the web page (pid %d) ended with %s", proc.pid, code)
