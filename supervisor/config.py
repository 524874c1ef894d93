"""ccsup's configuration: find the TOML file, parse and validate it, fill in defaults.

`parse(text, source, env)` is pure: it reads nothing but its arguments and validates everything
(unknown keys, types, caps, cap keys, durations, sizes, endpoints). It collects every problem it
can find in one pass and raises one ConfigProblems (a ConfigError, exit code 2) that lists them,
each naming the file, the dotted key (`slots.caps."opencode:xai"`) and the line. `load()` is the
only function that reads a file; `find_config_path()` and `resolve_state_dir()` only look at
the environment mapping given and whether the XDG file exists.

State: none of its own. Loading again reads the file again (a `reload` sees the new text); a file
that is half-written, empty or from a newer ccsup is validated like any other text: an empty file
means every default, an unknown key is an error naming it, never silently ignored. With no file
found, the embedded `supervisor/default.toml` serves.

Design note: tomllib gives no line numbers for values, so `_LineMap` scans the text once for
`[table]` headers and `key =` assignments and maps each dotted key path to its line; an error
about a key inside an inline table or a multi-line array names the line of the assignment that
holds it. The same `_SECTIONS` table drives the known-key check and the commented default that
`ccsup config init` writes (rendered with tomli-w), so the documentation cannot miss a key.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import NamedTuple

# Start-up cost matters here (every `ccsup` command parses the config): difflib, tomli_w and
# importlib.resources are imported where they are needed, regular expressions used only for an
# error, a size or a CURVE key are compiled on first use (re caches them), and the line map of a
# file is built only when there is a problem to place.
from .caps import Caps, check_cap, key_problem
from .errors import ConfigError, UsageError
from .web import settings as web_settings
from .web.settings import WebSettings, parse_web

DEFAULT_GRACE = 5.0
DEFAULT_SCAN = 2.0
DEFAULT_RESERVATION_TTL = 60.0
DEFAULT_CAP = 1
EMBEDDED_SOURCE = "<embedded defaults>"
TTL_ENV = "CCSUP_RESERVATION_TTL_MS"
# sun_path is 108 bytes including the terminating NUL: a longer ipc path cannot be bound.
MAX_IPC_PATH = 107
Z85_KEY_LENGTH = 40  # a 32-byte CURVE key in Z85
_Z85 = r"[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}\Z"  # compiled on first use


# ----------------------------------------------------------------------------- the values


@dataclass(frozen=True)
class Endpoints:
    """The three ZeroMQ endpoints; None means the default ipc:// socket in the state directory.

    `curve` is the `[endpoints.curve]` table, required before any endpoint may be tcp://:
    {"public_key": Z85, "secret_key": Z85, "client_keys": [Z85, ...]} and, when the file sets it,
    "client_secret_key": Z85 (40-character Z85 strings, as `zmq.curve_keypair()` makes).
    public_key/secret_key are the supervisor's own pair. client_keys are the public keys of the
    clients the supervisor lets in on its tcp:// endpoints (non-empty when one is tcp://; every
    other CURVE client is refused in the handshake). client_secret_key is the key the local CLI
    and Client use on tcp://; $CCSUP_CLIENT_SECRET_KEY wins over it (see client.py). A client
    needs no public key of its own in the file: it is computed from the secret one. CURVE is used
    on tcp:// endpoints only; ipc:// sockets are guarded by the state directory's permissions.
    """

    control: str | None = None
    bus_in: str | None = None
    bus_out: str | None = None
    curve: dict | None = None

    def resolve(self, state_dir: Path) -> Endpoints:
        """These endpoints with the defaults filled in: ipc://<state_dir>/control, bus-in, bus-out."""
        state_dir = Path(state_dir)
        resolved = Endpoints(
            control=self.control or f"ipc://{state_dir / 'control'}",
            bus_in=self.bus_in or f"ipc://{state_dir / 'bus-in'}",
            bus_out=self.bus_out or f"ipc://{state_dir / 'bus-out'}",
            curve=self.curve,
        )
        for name in ("control", "bus_in", "bus_out"):
            endpoint = getattr(resolved, name)
            path = endpoint[len("ipc://") :] if endpoint.startswith("ipc://") else None
            if path is not None and len(os.fsencode(path)) > MAX_IPC_PATH:
                raise ConfigError(
                    f"endpoints.{name}: the ipc socket path {path!r} is longer than {MAX_IPC_PATH} "
                    f"bytes, which a Unix socket cannot bind; use a shorter state directory or set "
                    f"endpoints.{name}"
                )
        return resolved


@dataclass(frozen=True)
class Harness:
    """`[harness.<name>]`: defaults a request may rely on."""

    name: str
    command: list[str] | None = None
    default_cap: int | None = None


@dataclass(frozen=True)
class Config:
    source: str  # the file path, or "<embedded defaults>"
    state_dir: Path | None  # from the file (~ expanded); None when the file does not set it
    caps: Caps
    reservation_ttl: float  # seconds; $CCSUP_RESERVATION_TTL_MS wins
    grace: float
    scan: float
    endpoints: Endpoints
    harness: Mapping[str, Harness] = field(default_factory=dict)
    web: WebSettings = WebSettings()

    def __post_init__(self):
        object.__setattr__(self, "harness", MappingProxyType(dict(self.harness)))


class Problem(NamedTuple):
    """One thing wrong with a configuration. key is the dotted key (None for a syntax error)."""

    source: str
    line: int | None
    key: str | None
    message: str

    def __str__(self) -> str:
        where = self.source if self.line is None else f"{self.source}:{self.line}"
        return f"{where}: {self.key}: {self.message}" if self.key else f"{where}: {self.message}"


class ConfigProblems(ConfigError):
    """Every problem found in one configuration, one per line in the message."""

    def __init__(self, problems: list[Problem]):
        self.problems = tuple(problems)
        super().__init__("\n".join(str(p) for p in problems))


# ----------------------------------------------------------------------------- durations, sizes

_DURATION = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)?\s*\Z", re.IGNORECASE)
_DURATION_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
_SIZE = r"(?i)\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*\Z"  # compiled on first use
# Single letters and IEC names are powers of 1024 (as systemd and docker read "1G"); kB, MB... are SI.
_SIZE_UNIT = {"": 1, "b": 1}
for _i, _letter in enumerate("kmgt", start=1):
    _SIZE_UNIT[_letter] = _SIZE_UNIT[_letter + "i"] = _SIZE_UNIT[_letter + "ib"] = 1024**_i
    _SIZE_UNIT[_letter + "b"] = 1000**_i


def _kind(value: object) -> str:
    """A TOML reader's name for the type of a parsed value."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return "a date or time"


def parse_duration(value: object, *, where: str) -> float:
    """Seconds from "5s", "500ms", "2m", "1h", "0.5" or a number of seconds; must be > 0."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        match = _DURATION.match(value)
        if not match:
            raise ConfigError(
                f'{where}: {value!r} is not a duration (write it like "5s", "500ms", "2m", "1h")'
            )
        unit = match.group(2).lower() if match.group(2) else None
        seconds = float(match.group(1)) * _DURATION_UNIT[unit]
    else:
        raise ConfigError(
            f'{where}: a duration is a string like "5s" or a number of seconds, not {_kind(value)}'
        )
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(f"{where}: a duration must be more than zero, not {value!r}")
    return seconds


def parse_size(value: object, *, where: str) -> int:
    """Bytes from "2GiB", "512MiB", "1G" (= GiB), "1GB" (10^9), "100k", "4096" or an integer; >= 0."""
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    elif isinstance(value, str):
        match = re.match(_SIZE, value)
        unit = match.group(2).lower() if match else None
        if not match or unit not in _SIZE_UNIT:
            raise ConfigError(
                f'{where}: {value!r} is not a size (write it like "2GiB", "512MiB", "100k" or bytes)'
            )
        size = int(float(match.group(1)) * _SIZE_UNIT[unit])
    else:
        raise ConfigError(
            f'{where}: a size is a string like "2GiB" or a whole number of bytes, not {_kind(value)}'
        )
    if size < 0:
        raise ConfigError(f"{where}: a size must not be negative, not {value!r}")
    return size


# ----------------------------------------------------------------------------- dotted keys, lines

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+\Z")
_SIMPLE = r"""(?:[A-Za-z0-9_-]+|"(?:[^"\\\n]|\\.)*"|'[^'\n]*')"""
_DOTTED = rf"{_SIMPLE}(?:[ \t]*\.[ \t]*{_SIMPLE})*"
_HEADER = rf"[ \t]*\[\[?[ \t]*({_DOTTED})[ \t]*\]"  # both compiled on first use
_ASSIGN = rf"[ \t]*({_DOTTED})[ \t]*="

KeyPath = tuple  # a key path: ("slots", "caps", "opencode:xai")


def dotted(path: KeyPath) -> str:
    """The key path as TOML writes it: slots.caps."opencode:xai"."""
    if all(_BARE_KEY.match(p) for p in path):
        return ".".join(path)
    import tomli_w  # only for a key that needs quoting

    return ".".join(
        p if _BARE_KEY.match(p) else tomli_w.dumps({p: 0}).split(" = ")[0] for p in path
    )


def _key_path(text: str) -> KeyPath:
    """The path a TOML dotted key denotes, decoded by tomllib itself (quotes and escapes)."""
    data: object = tomllib.loads(f"{text} = 0")
    path = []
    while isinstance(data, dict):
        ((name, data),) = data.items()
        path.append(name)
    return tuple(path)


class _LineMap:
    """Line numbers of table headers and key assignments, by key path (first occurrence wins)."""

    def __init__(self, text: str):
        self.lines: dict[KeyPath, int] = {}
        table: KeyPath = ()
        in_string = None  # the delimiter of a multi-line string we are inside
        for number, line in enumerate(text.splitlines(), start=1):
            if in_string:
                if line.count(in_string) % 2:
                    in_string = None
                continue
            header = re.match(_HEADER, line)
            assign = None if header else re.match(_ASSIGN, line)
            try:
                if header:
                    table = _key_path(header.group(1))
                    self.lines.setdefault(table, number)
                elif assign:
                    self.lines.setdefault(table + _key_path(assign.group(1)), number)
            except tomllib.TOMLDecodeError:
                pass  # not a key after all; the line is only a hint
            for delimiter in ('"""', "'''"):
                if line.count(delimiter) % 2:
                    in_string = delimiter
                    break

    def line_of(self, path: KeyPath) -> int | None:
        """The line of the key, or of the nearest enclosing key or table that is written down."""
        for length in range(len(path), 0, -1):
            if path[:length] in self.lines:
                return self.lines[path[:length]]
        return None


def _syntax_line(err: tomllib.TOMLDecodeError, text: str) -> int | None:
    match = re.search(r"at line (\d+)", str(err))
    if match:
        return int(match.group(1))
    if "end of document" in str(err):
        return max(1, len(text.splitlines()))
    return None


# ----------------------------------------------------------------------------- the schema


class _Key(NamedTuple):
    name: str
    value: object  # the default, or an example when `example` is true
    doc: str
    example: bool = False  # written commented out: the key is optional or has a computed default


class _Section(NamedTuple):
    name: str | None  # None: the top level
    doc: str
    keys: tuple
    example: bool = False  # the header itself is written commented out


_SECTIONS = (
    _Section(
        None,
        'ccsup configuration. Durations are strings such as "5s", "500ms", "2m"; sizes such\n'
        'as "2GiB", "512MiB" (K/M/G/T and KiB/MiB/... are powers of 1024, kB/MB/GB are SI).\n'
        "Check a file with `ccsup config check [--config FILE]`. A commented-out `# key = value`\n"
        "line shows an optional key with an example value: remove the '# ' to use it.\n",
        (
            _Key(
                "state_dir",
                "~/.local/state/ccsup",
                "Where slots, records, logs and sockets live (default: $XDG_STATE_HOME/ccsup, else\n"
                "~/.local/state/ccsup). --state-dir and $CCSUP_STATE_DIR win over this.",
                example=True,
            ),
        ),
    ),
    _Section(
        "slots",
        "The machine-wide gate: how many turns of a cap key run at once.",
        (
            _Key(
                "default_cap",
                DEFAULT_CAP,
                "The cap of a key that neither `caps` nor its harness's default_cap names (>= 1).",
            ),
            _Key(
                "reservation_ttl",
                "60s",
                "How long a reservation holds its slot before a turn binds it\n"
                "($CCSUP_RESERVATION_TTL_MS overrides it, for tests).",
            ),
            _Key(
                "machine_cap",
                8,
                "At most this many turns of all keys together (default: no machine cap).",
                example=True,
            ),
            _Key(
                "min_free_memory",
                "1GiB",
                "Grant no new turn while less memory than this is available\n(default: no floor).",
                example=True,
            ),
            _Key(
                "caps",
                {"codex": 2, "opencode:xai": 1, "opencode": 3},
                "Caps by key. A bare harness name (opencode = 3) gives that cap to every opencode:* key\n"
                "not named itself, each key on its own. Keys are `harness` or `harness:variant`.",
                example=True,
            ),
        ),
    ),
    _Section(
        "guard",
        "How a turn's guard ends the work.",
        (
            _Key("grace", "5s", "Between SIGTERM and SIGKILL when a turn is stopped."),
            _Key(
                "scan",
                "2s",
                "How often the guard scans for new process groups of the turn's descendants.",
            ),
        ),
    ),
    _Section(
        "endpoints",
        "ZeroMQ endpoints (defaults: ipc:// sockets in the state directory, reachable only\n"
        "by its owner). Only ipc:// (an absolute path) and tcp:// are accepted; a tcp://\n"
        "endpoint needs the [endpoints.curve] keys.",
        (
            _Key(
                "control",
                "ipc:///run/user/1000/ccsup/control",
                "The control socket (ROUTER); default ipc://<state_dir>/control.",
                example=True,
            ),
            _Key(
                "bus_in",
                "ipc:///run/user/1000/ccsup/bus-in",
                "Where publishers connect (XSUB); default ipc://<state_dir>/bus-in.",
                example=True,
            ),
            _Key(
                "bus_out",
                "ipc:///run/user/1000/ccsup/bus-out",
                "Where subscribers connect (XPUB); default ipc://<state_dir>/bus-out.",
                example=True,
            ),
        ),
    ),
    _Section(
        "endpoints.curve",
        "CURVE keys for tcp:// endpoints, 40-character Z85 strings; make a pair with\n"
        "python -c 'import zmq; print(*(k.decode() for k in zmq.curve_keypair()), sep=\"\\n\")'\n"
        "(public first). Keep this file private (chmod 600).",
        (
            _Key(
                "public_key",
                "<40 Z85 characters>",
                "The supervisor's public key (every client needs it).",
                example=True,
            ),
            _Key("secret_key", "<40 Z85 characters>", "The supervisor's secret key.", example=True),
            _Key(
                "client_keys",
                ["<40 Z85 characters>"],
                "The public keys of the clients let in on tcp:// (required with a tcp:// endpoint);\n"
                "any other client is refused in the CURVE handshake and gets no answer.",
                example=True,
            ),
            _Key(
                "client_secret_key",
                "<40 Z85 characters>",
                "The secret key `ccsup` itself uses on tcp:// ($CCSUP_CLIENT_SECRET_KEY wins over it);\n"
                "its public key must be in client_keys.",
                example=True,
            ),
        ),
        example=True,
    ),
    _Section(
        "harness.codex",
        "Per harness (the part of a key before ':'): defaults a request may rely on.",
        (
            _Key(
                "command",
                ["codex", "app-server"],
                "The command a sidecar runs for this harness.",
                example=True,
            ),
            _Key(
                "default_cap",
                2,
                "The cap of this harness's keys that `caps` does not name.",
                example=True,
            ),
        ),
        example=True,
    ),
    _Section(
        "web",
        "The live page (`ccsup web`), a client of the supervisor.",
        tuple(_Key(name, value, doc, example=True) for name, value, doc in web_settings.DOCS),
        example=True,
    ),
)
_KNOWN = {
    (): {"state_dir", "slots", "guard", "endpoints", "harness", "web"},
    ("slots",): {k.name for k in _SECTIONS[1].keys},
    ("guard",): {k.name for k in _SECTIONS[2].keys},
    ("endpoints",): {k.name for k in _SECTIONS[3].keys} | {"curve"},
    ("endpoints", "curve"): {k.name for k in _SECTIONS[4].keys},
    ("harness", "*"): {k.name for k in _SECTIONS[5].keys},
    ("web",): {k.name for k in _SECTIONS[6].keys},
}


# ----------------------------------------------------------------------------- parse


class _Checker:
    """Collects problems while reading the parsed document; `at(path)` is the line for a key."""

    def __init__(self, text: str, source: str):
        self.source = source
        self.text = text
        self._lines: _LineMap | None = None
        self.problems: list[Problem] = []

    @property
    def lines(self) -> _LineMap:
        """The line map, made on the first problem (a valid file never needs it)."""
        if self._lines is None:
            self._lines = _LineMap(self.text)
        return self._lines

    def add(self, path: KeyPath, message: str) -> None:
        self.problems.append(Problem(self.source, self.lines.line_of(path), dotted(path), message))

    def table(self, data: dict, path: KeyPath, known: set[str]) -> dict:
        """The sub-table at `path` (empty if absent); reports unknown keys and a non-table value."""
        value = data.get(path[-1], {}) if path else data
        if not isinstance(value, dict):
            self.add(path, f"must be a table, not {_kind(value)}")
            return {}
        for name in value:
            if name not in known:
                import difflib  # only for a mistake

                close = difflib.get_close_matches(name, sorted(known), n=1)
                hint = (
                    f" (did you mean {close[0]}?)"
                    if close
                    else f" (known: {', '.join(sorted(known))})"
                )
                self.add(path + (name,), "unknown key" + hint)
        return value

    def run(self, path: KeyPath, check, value):
        """check(value, where) or None, recording the ConfigError/UsageError it raises."""
        try:
            return check(value, where=dotted(path))
        except UsageError as err:
            prefix = dotted(path) + ": "
            message = err.message[len(prefix) :] if err.message.startswith(prefix) else err.message
            self.add(path, message)
            return None


def _cap(value: object, *, where: str) -> int:
    try:
        return check_cap(where, value)  # caps.py decides what a cap is
    except UsageError:
        raise ConfigError(f"{where}: a cap must be a whole number >= 1, not {value!r}") from None


def _string(value: object, *, where: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{where}: must be a string, not {_kind(value)}")
    if not value:
        raise ConfigError(f"{where}: must not be empty")
    return value


def _endpoint(value: object, *, where: str) -> str:
    value = _string(value, where=where)
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


def _z85_key(value: object, *, where: str) -> str:
    value = _string(value, where=where)
    if not re.match(_Z85, value):
        raise ConfigError(
            f"{where}: a CURVE key is {Z85_KEY_LENGTH} Z85 characters (see zmq.curve_keypair())"
        )
    return value


def _expand_home(text: str, env: Mapping[str, str]) -> Path:
    if text == "~" or text.startswith("~/"):
        home = env.get("HOME")
        return Path(home + text[1:]) if home else Path(text).expanduser()
    return Path(text)


def parse(text: str, source: str, env: Mapping[str, str] = {}) -> Config:
    """Validate a configuration's text. Pure: no I/O. Raises ConfigProblems listing every problem."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigProblems(
            [Problem(source, _syntax_line(err, text), None, f"invalid TOML: {err}")]
        ) from None
    c = _Checker(text, source)
    top = c.table(data, (), _KNOWN[()])

    state_dir = None
    if "state_dir" in top:
        value = c.run(("state_dir",), _string, top["state_dir"])
        if value is not None:
            path = _expand_home(value, env)
            if not path.is_absolute():
                c.add(("state_dir",), f"must be an absolute path or start with ~/, not {value!r}")
            else:
                state_dir = path

    slots = c.table(top, ("slots",), _KNOWN[("slots",)])
    default_cap = c.run(("slots", "default_cap"), _cap, slots.get("default_cap", DEFAULT_CAP))
    ttl = c.run(
        ("slots", "reservation_ttl"),
        parse_duration,
        slots.get("reservation_ttl", DEFAULT_RESERVATION_TTL),
    )
    machine_cap = (
        c.run(("slots", "machine_cap"), _cap, slots["machine_cap"])
        if "machine_cap" in slots
        else None
    )
    min_free = (
        c.run(("slots", "min_free_memory"), parse_size, slots["min_free_memory"])
        if "min_free_memory" in slots
        else None
    )
    caps: dict[str, int] = {}
    caps_table = slots.get("caps", {})
    if not isinstance(caps_table, dict):
        c.add(("slots", "caps"), f"must be a table of key = cap, not {_kind(caps_table)}")
        caps_table = {}
    for key, value in caps_table.items():
        path = ("slots", "caps", key)
        problem = key_problem(key)
        if problem:
            c.add(path, f"bad cap key: {problem}")
            continue
        cap = c.run(path, _cap, value)
        if cap is not None:
            caps[key] = cap

    guard = c.table(top, ("guard",), _KNOWN[("guard",)])
    grace = c.run(("guard", "grace"), parse_duration, guard.get("grace", DEFAULT_GRACE))
    scan = c.run(("guard", "scan"), parse_duration, guard.get("scan", DEFAULT_SCAN))

    endpoints = _parse_endpoints(c, top)
    harness = _parse_harness(c, top)
    web, web_problems = parse_web(c.table(top, ("web",), _KNOWN[("web",)]))
    for path, message in web_problems:
        c.add(path, message)

    if TTL_ENV in env:
        raw = env[TTL_ENV]
        try:
            ms = float(raw)
        except ValueError:
            ms = float("nan")
        if not math.isfinite(ms) or ms <= 0:
            c.problems.append(
                Problem(
                    "environment",
                    None,
                    f"${TTL_ENV}",
                    f"must be a number of milliseconds > 0, not {raw!r}",
                )
            )
        else:
            ttl = ms / 1000.0

    if c.problems:
        # In file order, as an editor walks them; those without a line (the environment) last.
        raise ConfigProblems(
            sorted(c.problems, key=lambda p: p.line if p.line is not None else math.inf)
        )
    harness_default = {
        name: h.default_cap for name, h in harness.items() if h.default_cap is not None
    }
    return Config(
        source=source,
        state_dir=state_dir,
        caps=Caps(default_cap, caps, harness_default, machine_cap, min_free),
        reservation_ttl=ttl,
        grace=grace,
        scan=scan,
        endpoints=endpoints,
        harness=harness,
        web=web,
    )


def _parse_endpoints(c: _Checker, top: dict) -> Endpoints:
    table = c.table(top, ("endpoints",), _KNOWN[("endpoints",)])
    values = {}
    for name in ("control", "bus_in", "bus_out"):
        values[name] = c.run(("endpoints", name), _endpoint, table[name]) if name in table else None
    curve = None
    if "curve" in table:
        curve_table = c.table(table, ("endpoints", "curve"), _KNOWN[("endpoints", "curve")])
        keys = {}
        for name in ("public_key", "secret_key"):
            if name not in curve_table:
                c.add(
                    ("endpoints", "curve"),
                    f"{name} is missing (both public_key and secret_key are needed)",
                )
            else:
                keys[name] = c.run(("endpoints", "curve", name), _z85_key, curve_table[name])
        client_keys = _parse_client_keys(c, curve_table)
        client_secret = None
        if "client_secret_key" in curve_table:
            client_secret = c.run(
                ("endpoints", "curve", "client_secret_key"),
                _z85_key,
                curve_table["client_secret_key"],
            )
        has_tcp = any(value and value.startswith("tcp://") for value in values.values())
        if has_tcp and client_keys == []:
            c.add(
                ("endpoints", "curve", "client_keys"),
                "a tcp:// endpoint needs the public keys of the clients it lets in "
                '(client_keys = ["<40 Z85 characters>", ...]); without them it would let in anyone',
            )
        if len(keys) == 2 and None not in keys.values():
            problem = _curve_pair_problem(keys["public_key"], keys["secret_key"])
            if problem:
                c.add(("endpoints", "curve", "public_key"), problem)
            elif client_keys is not None:
                curve = dict(keys, client_keys=client_keys)
        if client_secret is not None and client_keys:
            public = _curve_public(client_secret)
            if public is not None and public not in client_keys:
                c.add(
                    ("endpoints", "curve", "client_secret_key"),
                    f"its public key {public} is not in client_keys, so the supervisor would refuse this client",
                )
        if curve is not None and client_secret is not None:
            curve["client_secret_key"] = client_secret
    for name, value in values.items():
        if value and value.startswith("tcp://") and curve is None and "curve" not in table:
            c.add(
                ("endpoints", name),
                "a tcp:// endpoint is refused unless [endpoints.curve] public_key, secret_key and "
                "client_keys are configured",
            )
    return Endpoints(values["control"], values["bus_in"], values["bus_out"], curve)


def _parse_client_keys(c: _Checker, curve_table: dict) -> list[str] | None:
    """The allowed client public keys ([] when absent); None when the value has a problem."""
    path = ("endpoints", "curve", "client_keys")
    value = curve_table.get("client_keys", [])
    if not isinstance(value, list):
        c.add(path, f"must be an array of public keys, not {_kind(value)}")
        return None
    keys, bad = [], False
    for index, key in enumerate(value, start=1):
        try:
            keys.append(_z85_key(key, where=f"entry {index}"))
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


def _parse_harness(c: _Checker, top: dict) -> dict[str, Harness]:
    table = top.get("harness", {})
    if not isinstance(table, dict):
        c.add(("harness",), f"must be a table of [harness.<name>] tables, not {_kind(table)}")
        return {}
    harness = {}
    for name in table:
        path = ("harness", name)
        problem = key_problem(name)
        if problem or ":" in name:
            c.add(path, f"bad harness name: {problem or 'a harness name has no :variant part'}")
            continue
        entry = c.table(table, path, _KNOWN[("harness", "*")])
        command = None
        if "command" in entry:
            value = entry["command"]
            if (
                not isinstance(value, list)
                or not value
                or not all(isinstance(arg, str) for arg in value)
                or not value[0]
            ):
                c.add(
                    path + ("command",), "must be a non-empty array of strings, the program first"
                )
            else:
                command = list(value)
        default_cap = (
            c.run(path + ("default_cap",), _cap, entry["default_cap"])
            if "default_cap" in entry
            else None
        )
        harness[name] = Harness(name, command, default_cap)
    return harness


# ----------------------------------------------------------------------------- finding, loading


def _home(env: Mapping[str, str]) -> Path:
    return Path(env["HOME"]) if env.get("HOME") else Path.home()


def _xdg(env: Mapping[str, str], variable: str, fallback: str) -> Path:
    value = env.get(variable, "")
    # The XDG spec: a relative value is invalid and is ignored.
    return Path(value) if value and os.path.isabs(value) else _home(env) / fallback


def xdg_config_path(env: Mapping[str, str]) -> Path:
    """$XDG_CONFIG_HOME/ccsup/ccsup.toml (default ~/.config), whether it exists or not."""
    return _xdg(env, "XDG_CONFIG_HOME", ".config") / "ccsup" / "ccsup.toml"


def find_config_path(cli_path: str | None, env: Mapping[str, str]) -> Path | None:
    """--config, else $CCSUP_CONFIG, else the XDG file if it exists, else None (embedded defaults)."""
    if cli_path:
        return _expand_home(cli_path, env)
    if env.get("CCSUP_CONFIG"):
        return _expand_home(env["CCSUP_CONFIG"], env)
    path = xdg_config_path(env)
    return path if path.is_file() else None


def embedded_text() -> str:
    """The text of the embedded supervisor/default.toml."""
    from importlib import resources  # 5 ms of imports, for the case of no config file

    return resources.files("supervisor").joinpath("default.toml").read_text(encoding="utf-8")


def load(cli_path: str | None = None, env: Mapping[str, str] = os.environ) -> Config:
    """Find, read and parse the configuration. The only function here that reads a file."""
    path = find_config_path(cli_path, env)
    if path is None:
        return parse(embedded_text(), EMBEDDED_SOURCE, env)
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as err:
        raise ConfigError(f"unable to read config {path}: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"unable to read config {path}: not UTF-8 text ({err.reason} at byte {err.start})"
        ) from None
    return parse(text, str(path), env)


def resolve_state_dir(cli_value: str | None, env: Mapping[str, str], config: Config) -> Path:
    """--state-dir > $CCSUP_STATE_DIR > config.state_dir > $XDG_STATE_HOME/ccsup > ~/.local/state/ccsup.

    Always absolute: the daemon's ipc:// endpoints are paths inside it.
    """
    for value in (cli_value, env.get("CCSUP_STATE_DIR")):
        if value:
            return Path(os.path.abspath(_expand_home(value, env)))
    if config.state_dir is not None:
        return config.state_dir
    return _xdg(env, "XDG_STATE_HOME", ".local/state") / "ccsup"


# ----------------------------------------------------------------------------- the commented default


def _toml_value(value: object) -> str:
    if isinstance(value, dict):
        items = (f"{dotted((k,))} = {_toml_value(v)}" for k, v in value.items())
        return "{ " + ", ".join(items) + " }"
    if isinstance(value, list):  # one line, so that commenting it out is one "# "
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    import tomli_w  # only `config init` and its tests render values

    return tomli_w.dumps({"x": value}).split(" = ", 1)[1].strip()


def default_config_text() -> str:
    """The commented default configuration that `ccsup config init` writes.

    Every key is explained; optional keys are shown commented out with an example value. Parsed,
    it gives the embedded defaults (supervisor/default.toml is this very text).
    """
    out: list[str] = []
    for section in _SECTIONS:
        if out:
            out.append("")
        # A doc ending in a blank line is the file's header, set apart from its first key.
        out.extend(f"# {line}".rstrip() if line else "" for line in section.doc.split("\n"))
        if section.name:
            out.append(f"{'# ' if section.example else ''}[{section.name}]")
        for key in section.keys:
            out.extend(f"# {line}".rstrip() for line in key.doc.splitlines())
            out.append(f"{'# ' if key.example else ''}{key.name} = {_toml_value(key.value)}")
    return "\n".join(out) + "\n"
