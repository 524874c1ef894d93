"""Who is at the other end of a loopback TCP connection: the uid that owns the client's socket.

Design note. Without `[web] token` the page listens on loopback only, and loopback is open to
every local user: as uid 65534, curl could read the owner's turn output and cancel a turn,
although the state directory and its sockets are the owner's alone. A Unix socket would carry
the peer's credentials (SO_PEERCRED), but a browser speaks TCP; so, on loopback, the kernel's
socket table answers instead: both ends of the connection are on this machine, and
/proc/net/tcp (tcp6 for IPv6 and v4-mapped peers) lists the client's socket, whose local address
is our peer's and whose remote address is ours, with the uid that created it and its inode. The
page serves only when that uid is its own (supervisor.web.access.Gate.check_peer).

What is refused rather than guessed: a peer whose socket is not found, and one whose row has no
inode (the socket closed already, or a TIME_WAIT entry, both shown as uid 0, which would pass for
root). Rejected: a token always required on loopback (a one-time link per browser, every script
given a secret, for what the kernel can say), and identd-style lookups by port alone (a port
pair is unique per address pair, so both addresses are matched).

The cost: the kernel walks its whole connection table for a read, ~7-9 ms a table here whatever
its rows, so the page looks once per connection (keep-alive reuses it), in a worker thread
(supervisor.web.app), the likelier table first. Rejected for now: NETLINK_SOCK_DIAG, which looks
up the one socket by its four-tuple (faster, but a binary protocol of its own to maintain).
Reads only; holds no state.
"""

from __future__ import annotations

import ipaddress
import struct

TABLES = ("/proc/net/tcp", "/proc/net/tcp6")


def _proc_address(host: str, port: int, width: int) -> str:
    """host:port as /proc/net/tcp{,6} writes it: the address's 32-bit words in host order, hex."""
    ip = ipaddress.ip_address(host)
    if width == 16 and ip.version == 4:
        ip = ipaddress.IPv6Address(f"::ffff:{ip}")
    elif width == 4 and ip.version == 6:
        mapped = ip.ipv4_mapped
        if mapped is None:
            return ""
        ip = mapped
    packed = ip.packed
    words = struct.unpack(f"={len(packed) // 4}I", packed)
    return "".join(f"{w:08X}" for w in words) + f":{port:04X}"


def peer_uid(local: tuple, peer: tuple) -> int | None:
    """The uid owning the socket at `peer` connected to our `local` (each an address tuple as
    getsockname/getpeername give it); None when no open socket of this machine matches."""
    # A v4 peer's connection is in tcp (tcp6 only for a v4-mapped one on a v6 socket): each table
    # costs ~7-9 ms to read here, so the likelier one first.
    order = list(zip(TABLES, (4, 16), strict=True))
    if ":" in str(peer[0]) and not str(peer[0]).startswith("::ffff:"):
        order.reverse()
    for table, width in order:
        theirs = _proc_address(peer[0], peer[1], width)
        ours = _proc_address(local[0], local[1], width)
        if not theirs or not ours:
            continue
        try:
            with open(table, "rb") as f:
                lines = f.read().decode("ascii", "replace").splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[1] != theirs or fields[2] != ours:
                continue
            uid, inode = fields[7], fields[9]
            if inode == "0" or not uid.isdigit():
                return None  # closed, or a TIME_WAIT row: nobody to name
            return int(uid)
    return None
