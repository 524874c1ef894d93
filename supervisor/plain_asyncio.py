"""asyncio for the supervisor's own process, imported without its TLS support.

Design note. Importing asyncio imports `ssl` (base_events, selector_events and sslproto try it
and fall back to None), and `ssl` loads OpenSSL, libssl and libcrypto: about 4 MiB of the
supervisor's RSS, a tenth of it with 500 turns running. The supervisor runs no TLS on its event
loop: its sockets are ZeroMQ (CURVE on tcp://), its etcd client is http.client in threads, and
the web page is a process of its own. So `ccsup start --foreground` imports asyncio first, with
`ssl` unavailable for that one import, before anything else imports asyncio; `ssl` itself stays
importable after it (etcd over https imports it when configured).

What it costs: on the supervisor's loop, asyncio's TLS (`create_connection(ssl=...)`,
`start_tls`) fails with "Python ssl module is not available"; whoever puts TLS on that loop
deletes this module. asyncio reads `ssl` nowhere else but to refuse an ssl.SSLSocket given as a
plain socket. Rejected: a stand-in module for `ssl` that loads the real one when touched (asyncio
touches its attributes while it is imported); importing asyncio later (the supervisor is its
event loop).

State: none. In a process that imported asyncio or ssl already, this does nothing.
"""

from __future__ import annotations

import sys


def import_asyncio_without_tls() -> None:
    if "asyncio" in sys.modules or "ssl" in sys.modules:
        return  # too late, or nothing to save: OpenSSL is loaded
    sys.modules["ssl"] = None  # type: ignore[assignment]  # None here: `import ssl` fails
    try:
        import asyncio  # noqa: F401 -- imported for the process, with `ssl = None` inside
    finally:
        del sys.modules["ssl"]
