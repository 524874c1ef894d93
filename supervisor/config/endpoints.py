"""`[endpoints]` and `[endpoints.curve]`: where the ZeroMQ sockets are, and the CURVE keys a
tcp:// endpoint needs. Pure but for pyzmq's key arithmetic (imported only when keys are given)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import NotRequired, TypedDict

from ..errors import ConfigError
from ..paths import StatePaths, ipc_path
from .schema import Checker, Key, Section, Table, kind
from .values import string

# sun_path is 108 bytes including the terminating NUL: a longer ipc path cannot be bound.
MAX_IPC_PATH = 107
Z85_KEY_LENGTH = 40  # a 32-byte CURVE key in Z85
_Z85 = r"[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}\Z"  # compiled on first use

_EXAMPLE_KEY = "<40 Z85 characters>"
SECTION = Section(
    ("endpoints",),
    "ZeroMQ endpoints (defaults: ipc:// sockets in the state directory, reachable only\n"
    "by its owner). Only ipc:// (an absolute path) and tcp:// are accepted; a tcp://\n"
    "endpoint needs the [endpoints.curve] keys.",
    (
        Key(
            "control",
            "ipc:///run/user/1000/ccsup/control",
            "The control socket (ROUTER); default ipc://<state_dir>/control.",
            example=True,
        ),
        Key(
            "bus_in",
            "ipc:///run/user/1000/ccsup/bus-in",
            "Where publishers connect (XSUB); default ipc://<state_dir>/bus-in.",
            example=True,
        ),
        Key(
            "bus_out",
            "ipc:///run/user/1000/ccsup/bus-out",
            "Where subscribers connect (XPUB); default ipc://<state_dir>/bus-out.",
            example=True,
        ),
    ),
)
CURVE_SECTION = Section(
    ("endpoints", "curve"),
    "CURVE keys for tcp:// endpoints, 40-character Z85 strings; make a pair with\n"
    "python -c 'import zmq; print(*(k.decode() for k in zmq.curve_keypair()), sep=\"\\n\")'\n"
    "(public first). Keep this file private (chmod 600).",
    (
        Key(
            "public_key",
            _EXAMPLE_KEY,
            "The supervisor's public key (every client needs it).",
            example=True,
        ),
        Key("secret_key", _EXAMPLE_KEY, "The supervisor's secret key.", example=True),
        Key(
            "client_keys",
            [_EXAMPLE_KEY],
            "The public keys of the clients let in on tcp:// (required with a tcp:// endpoint);\n"
            "any other client is refused in the CURVE handshake and gets no answer.",
            example=True,
        ),
        Key(
            "client_secret_key",
            _EXAMPLE_KEY,
            "The secret key `ccsup` itself uses on tcp:// ($CCSUP_CLIENT_SECRET_KEY wins over it);\n"
            "its public key must be in client_keys.",
            example=True,
        ),
    ),
    example=True,
)


class CurveKeys(TypedDict):
    """`[endpoints.curve]`, 40-character Z85 strings as `zmq.curve_keypair()` makes them."""

    public_key: str  # the supervisor's own pair
    secret_key: str
    client_keys: list[str]  # the clients let in on tcp:// (non-empty when one is tcp://)
    client_secret_key: NotRequired[str]  # the key the local CLI and Client use on tcp://


@dataclass(frozen=True)
class Endpoints:
    """The three ZeroMQ endpoints; None means the default ipc:// socket in the state directory.

    `curve` is the `[endpoints.curve]` table, required before any endpoint may be tcp://.
    public_key/secret_key are the supervisor's own pair. client_keys are the public keys of the
    clients the supervisor lets in on its tcp:// endpoints (every other CURVE client is refused in
    the handshake). client_secret_key is the key the local CLI and Client use on tcp://;
    $CCSUP_CLIENT_SECRET_KEY wins over it (see client.py). A client needs no public key of its own
    in the file: it is computed from the secret one. CURVE is used on tcp:// endpoints only;
    ipc:// sockets are guarded by the state directory's permissions.
    """

    control: str | None = None
    bus_in: str | None = None
    bus_out: str | None = None
    curve: CurveKeys | None = None

    def resolve(self, state_dir: Path) -> Endpoints:
        """These endpoints with the defaults filled in: ipc://<state_dir>/control, bus-in, bus-out."""
        paths = StatePaths(Path(state_dir))
        resolved = Endpoints(
            control=self.control or paths.endpoint("control"),
            bus_in=self.bus_in or paths.endpoint("bus-in"),
            bus_out=self.bus_out or paths.endpoint("bus-out"),
            curve=self.curve,
        )
        for name in ("control", "bus_in", "bus_out"):
            path = ipc_path(getattr(resolved, name))
            if path is not None and len(os.fsencode(path)) > MAX_IPC_PATH:
                raise ConfigError(
                    f"endpoints.{name}: the ipc socket path {path!r} is longer than {MAX_IPC_PATH} "
                    f"bytes, which a Unix socket cannot bind; use a shorter state directory or set "
                    f"endpoints.{name}"
                )
        return resolved


def endpoint(value: object, *, where: str) -> str:
    """An `ipc:///absolute/path` (short enough to bind) or `tcp://HOST:PORT` endpoint."""
    value = string(value, where=where)
    scheme, sep, rest = value.partition("://")
    if not sep or scheme not in ("ipc", "tcp"):
        raise ConfigError(f"{where}: {value!r} is not an ipc:// or tcp:// endpoint")
    if scheme == "ipc":
        if not rest.startswith("/"):
            raise ConfigError(
                f"{where}: an ipc endpoint needs an absolute path (ipc:///...), not {value!r}"
            )
        if len(os.fsencode(rest)) > MAX_IPC_PATH:
            raise ConfigError(
                f"{where}: the ipc path is longer than {MAX_IPC_PATH} bytes, which a Unix socket cannot bind"
            )
    else:
        host, colon, port = rest.rpartition(":")
        if not colon or not host or not (port == "*" or (port.isdigit() and 0 < int(port) < 65536)):
            raise ConfigError(f"{where}: a tcp endpoint is tcp://HOST:PORT, not {value!r}")
    return value


def z85_key(value: object, *, where: str) -> str:
    value = string(value, where=where)
    if not re.match(_Z85, value):
        raise ConfigError(
            f"{where}: a CURVE key is {Z85_KEY_LENGTH} Z85 characters (see zmq.curve_keypair())"
        )
    return value


def parse_endpoints(c: Checker, top: Table) -> Endpoints:
    table = c.table(top, ("endpoints",))
    values: dict[str, str | None] = {}
    for name in ("control", "bus_in", "bus_out"):
        values[name] = c.run(("endpoints", name), endpoint, table[name]) if name in table else None
    curve = None
    if "curve" in table:
        has_tcp = any(value and value.startswith("tcp://") for value in values.values())
        curve = _parse_curve(c, table, has_tcp)
    for name, value in values.items():
        if value and value.startswith("tcp://") and curve is None and "curve" not in table:
            c.add(
                ("endpoints", name),
                "a tcp:// endpoint is refused unless [endpoints.curve] public_key, secret_key and "
                "client_keys are configured",
            )
    return Endpoints(values["control"], values["bus_in"], values["bus_out"], curve)


def _parse_curve(c: Checker, table: Table, has_tcp: bool) -> CurveKeys | None:
    """`[endpoints.curve]`, or None when it has a problem (each one recorded)."""
    curve_table = c.table(table, ("endpoints", "curve"))
    keys: dict[str, str | None] = {}
    for name in ("public_key", "secret_key"):
        if name not in curve_table:
            c.add(
                ("endpoints", "curve"),
                f"{name} is missing (both public_key and secret_key are needed)",
            )
        else:
            keys[name] = c.run(("endpoints", "curve", name), z85_key, curve_table[name])
    client_keys = _parse_client_keys(c, curve_table)
    client_secret = None
    if "client_secret_key" in curve_table:
        client_secret = c.run(
            ("endpoints", "curve", "client_secret_key"),
            z85_key,
            curve_table["client_secret_key"],
        )
    if has_tcp and client_keys == []:
        c.add(
            ("endpoints", "curve", "client_keys"),
            "a tcp:// endpoint needs the public keys of the clients it lets in "
            '(client_keys = ["<40 Z85 characters>", ...]); without them it would let in anyone',
        )
    curve: CurveKeys | None = None
    public, secret = keys.get("public_key"), keys.get("secret_key")
    if public is not None and secret is not None:
        problem = _curve_pair_problem(public, secret)
        if problem:
            c.add(("endpoints", "curve", "public_key"), problem)
        elif client_keys is not None:
            curve = CurveKeys(public_key=public, secret_key=secret, client_keys=client_keys)
    if client_secret is not None and client_keys:
        client_public = _curve_public(client_secret)
        if client_public is not None and client_public not in client_keys:
            c.add(
                ("endpoints", "curve", "client_secret_key"),
                f"its public key {client_public} is not in client_keys, so the supervisor would refuse this client",
            )
    if curve is not None and client_secret is not None:
        curve["client_secret_key"] = client_secret
    return curve


def _parse_client_keys(c: Checker, curve_table: Table) -> list[str] | None:
    """The allowed client public keys ([] when absent); None when the value has a problem."""
    path = ("endpoints", "curve", "client_keys")
    value = curve_table.get("client_keys", [])
    if not isinstance(value, list):
        c.add(path, f"must be an array of public keys, not {kind(value)}")
        return None
    keys, bad = [], False
    for index, key in enumerate(value, start=1):
        try:
            keys.append(z85_key(key, where=f"entry {index}"))
        except ConfigError as err:
            c.add(path, err.message)
            bad = True
    return None if bad else keys


def _curve_public(secret: str) -> str | None:
    """The public key of a Z85 secret key, when pyzmq is there to compute it."""
    try:
        import zmq
    except ImportError:
        return None
    return zmq.curve_public(secret.encode()).decode() if zmq.has("curve") else None


def _curve_pair_problem(public: str, secret: str) -> str | None:
    """Whether the public key belongs to the secret key, when pyzmq can tell (pure computation)."""
    try:
        import zmq  # only here: parsing stays light for configs without CURVE
    except ImportError:
        return None
    if not zmq.has("curve"):
        return "this libzmq has no CURVE support, so a tcp:// endpoint cannot be secured"
    if zmq.curve_public(secret.encode()) != public.encode():
        return "public_key is not the public key of secret_key"
    return None
