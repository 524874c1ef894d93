"""What the supervisor's process holds at start (its RSS with 500 turns at most 45 MiB).

Each check names a module or library the supervisor left out and how much RSS it took: one that
comes back (an eager import somewhere) fails here rather than only in tests/bench/bench_scale.py.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

from supervisor.daemon import memtrim

# What `ccsup start --foreground` does before it serves: the same imports, in the same order.
START = (
    "import sys\n"
    "from supervisor.cli import main\n"
    "import supervisor.cli.start\n"
    "from supervisor.plain_asyncio import import_asyncio_without_tls\n"
    "import_asyncio_without_tls()\n"
    "import supervisor.daemon.main\n"
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


def test_memory_is_trimmed_after_work_and_not_while_idle():
    """The process's CPU time is the trimmer's only clue; here the test sets it."""
    calls: list[int] = []
    used = [0.0]  # the process's CPU seconds, as the trimmer reads them
    looks = [0]  # how often the trimmer read them

    def cpu() -> float:
        looks[0] += 1
        return used[0]

    async def settled(count: int) -> None:
        """Wait for `count` trims (they run in a worker thread), then ten more looks: any extra
        trim would be seen."""
        deadline = time.monotonic() + 10
        while len(calls) < count:
            assert time.monotonic() < deadline, f"{len(calls)} trims, {count} expected"
            await asyncio.sleep(0.01)
        seen = looks[0]
        while looks[0] < seen + 10:
            assert time.monotonic() < deadline, "the trimmer stopped looking"
            await asyncio.sleep(0.01)

    async def main():
        task = asyncio.create_task(
            memtrim.trim_after_work(interval=0.01, after_cpu=0.01, trim=calls.append, cpu=cpu)
        )
        await settled(0)
        assert calls == []  # idle since the start
        used[0] += 0.005
        await settled(0)
        assert calls == []  # not enough work yet
        used[0] += 0.005
        await settled(1)
        assert calls == [0]  # malloc_trim(0), once
        used[0] += 0.05
        await settled(2)
        assert calls == [0, 0]  # once for a burst of work, then idle again
        task.cancel()

    asyncio.run(main())


def test_malloc_trim_gives_back_what_a_thread_freed():
    """What the trimmer calls does what it is for: memory a thread freed in holes of its arena
    (kept by glibc, like ZeroMQ's I/O thread's) leaves the RSS."""
    code = (
        "import re, threading\n"
        "from supervisor.daemon.memtrim import _malloc_trim\n"
        "def rss(): return int(re.search(r'VmRSS:\\s+(\\d+)', open('/proc/self/status').read())[1])\n"
        "kept = []\n"
        "def churn():\n"
        '    blocks = [b"x" * 20000 for _ in range(2000)]\n'
        "    kept.extend(blocks[::50])  # holes: the arena's top is not free\n"
        "t = threading.Thread(target=churn); t.start(); t.join()\n"
        "before = rss(); _malloc_trim()(0); print(before - rss())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 20_000  # KiB: most of the 40 MB freed
