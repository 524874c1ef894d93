"""What the supervisor's process holds at start (issue 13: its RSS with 500 turns at most 45 MiB).

Each check names a module or library the supervisor left out and how much RSS it took: one that
comes back (an eager import somewhere) fails here rather than only in tests/bench/bench_scale.py.
"""

from __future__ import annotations

import subprocess
import sys

# What `ccsup start --foreground` does before it serves: the same imports, in the same order.
START = (
    "import sys\n"
    "from supervisor.cli import main\n"
    "import supervisor.cli.start\n"
    "from supervisor.plain_asyncio import import_asyncio_without_tls\n"
    "import_asyncio_without_tls()\n"
    "import supervisor.daemon\n"
)

LEFT_OUT = {
    "ssl": "OpenSSL, ~4 MiB (supervisor.plain_asyncio)",
    "_hashlib": "OpenSSL's libcrypto",
    "prometheus_client": "~1 MiB, imported when the metrics are asked for",
    "http.server": "~1.6 MiB, with [metrics] listen only",
    "urllib.request": "~1.2 MiB (prometheus_client's)",
}


def _imported_at_start(then: str = "") -> list[str]:
    code = START + then + f"print(sorted(m for m in {sorted(LEFT_OUT)!r} if m in sys.modules))\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return eval(done.stdout.splitlines()[-1])


def test_the_supervisor_imports_none_of_what_only_some_configs_need():
    assert _imported_at_start() == []


def test_asyncio_comes_without_tls_but_ssl_stays_importable():
    """etcd over https imports ssl after the start: it must still be the real module."""
    got = _imported_at_start(
        "import asyncio.base_events, ssl\n"
        "assert asyncio.base_events.ssl is None\n"
        "assert ssl.create_default_context().verify_mode == ssl.CERT_REQUIRED\n"
    )
    assert got == ["ssl"]  # loaded now, by the import after the start


def test_the_running_supervisor_maps_no_openssl(daemon):
    d = daemon()
    with open(f"/proc/{d.proc.pid}/maps") as f:
        libraries = {line.split()[-1] for line in f if ".so" in line}
    assert not [lib for lib in libraries if "libssl" in lib or "libcrypto" in lib]
