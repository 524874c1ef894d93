"""systemd's notify protocol (Type=notify): READY=1 once the supervisor serves, STOPPING=1 when it
stops. The socket's address is taken out of the environment at start, so no turn inherits it; not
under systemd, nothing is sent. State: the address, for the process's life."""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger("ccsup.daemon")

notify_socket: str | None = None


def take_notify_socket() -> None:
    """$NOTIFY_SOCKET, taken out of the environment (once, at the supervisor's start)."""
    global notify_socket
    notify_socket = os.environ.pop("NOTIFY_SOCKET", None)


def notify(message: str) -> None:
    """Tell systemd about our state; nothing when not under systemd."""
    address = notify_socket
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(message.encode())
    except OSError as e:
        log.warning("unable to notify systemd at %s: %s", address, e)
