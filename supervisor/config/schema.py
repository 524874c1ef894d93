"""The machinery every section parser shares: the schema types, the problem list, line numbers.

A section describes itself with a `Section` (its key path, its doc and its `Key`s with defaults or
examples); the same descriptions drive the known-key check and the commented default that
`ccsup config init` writes. A section parser reads the parsed document through a `Checker`, which
collects every `Problem` (file, dotted key, line) instead of stopping at the first.

It knows TOML documents and dotted keys, nothing of what any section means.

Design note: tomllib gives no line numbers for values, so `LineMap` scans the text once for
`[table]` headers and `key =` assignments and maps each dotted key path to its line; an error
about a key inside an inline table or a multi-line array names the line of the assignment that
holds it. The map is built only when there is a problem to place (a valid file never needs it).
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple, TypeVar

from ..errors import ConfigError, UsageError

KeyPath = tuple[str, ...]  # a key path: ("slots", "caps", "opencode:xai")
Table = dict[str, Any]  # a parsed TOML table
T = TypeVar("T")

# A value check: the value and the dotted key it was found at -> the checked value, or a
# ConfigError/UsageError whose message starts with "<where>: ".
Check = Callable[..., T]


class Key(NamedTuple):
    name: str
    value: object  # the default, or an example when `example` is true
    doc: str
    example: bool = False  # written commented out: the key is optional or has a computed default


class Section(NamedTuple):
    """One table of the file. `path` is () for the top level; a `*` part stands for any name
    (`("harness", "*")` is every `[harness.<name>]`), written as `example_name` in the template."""

    path: KeyPath
    doc: str
    keys: tuple[Key, ...]
    example: bool = False  # the header itself is written commented out
    example_name: str = ""  # what `*` is written as in the commented default


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


def kind(value: object) -> str:
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


# ----------------------------------------------------------------------------- dotted keys, lines

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+\Z")
_SIMPLE = r"""(?:[A-Za-z0-9_-]+|"(?:[^"\\\n]|\\.)*"|'[^'\n]*')"""
_DOTTED = rf"{_SIMPLE}(?:[ \t]*\.[ \t]*{_SIMPLE})*"
_HEADER = rf"[ \t]*\[\[?[ \t]*({_DOTTED})[ \t]*\]"  # both compiled on first use
_ASSIGN = rf"[ \t]*({_DOTTED})[ \t]*="


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


class LineMap:
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


def syntax_problem(err: tomllib.TOMLDecodeError, text: str, source: str) -> Problem:
    """The problem for a file tomllib cannot read, with the line it names."""
    line: int | None = None
    match = re.search(r"at line (\d+)", str(err))
    if match:
        line = int(match.group(1))
    elif "end of document" in str(err):
        line = max(1, len(text.splitlines()))
    return Problem(source, line, None, f"invalid TOML: {err}")


# ----------------------------------------------------------------------------- the checker


def known_keys(sections: tuple[Section, ...], path: KeyPath) -> set[str]:
    """The keys allowed in the table at `path`: its own keys and the sub-tables sections name."""
    known: set[str] = set()
    depth = len(path)
    for section in sections:
        if section.path == path:
            known.update(key.name for key in section.keys)
        elif len(section.path) > depth and section.path[:depth] == path:
            known.add(section.path[depth])
    return known


Report = Callable[[KeyPath, str], None]  # (key path, message): one problem with the config


def per_key(
    report: Report,
    data: Mapping[str, object],
    path: KeyPath,
    *,
    holds: str,
    check_key: Callable[[str], str | None],
    bad_key: str = "bad cap key",
) -> Iterator[tuple[str, KeyPath, object]]:
    """Each entry of the per-key table at `path` in `data` (`[slots] caps`, `rates`,
    `[limits.<key>]`, `[pause_on.<key>]`, ...) whose key passes `check_key`: (key, its path, its
    value), for the section to parse. An absent table has no entries; a value that is not a table
    ("must be a table of <holds>") and each key that `check_key` finds a problem with ("<bad_key>:
    <problem>") are reported and skipped."""
    table = data.get(path[-1], {})
    if not isinstance(table, dict):
        report(path, f"must be a table of {holds}, not {kind(table)}")
        return
    for key, value in table.items():
        problem = check_key(key)
        if problem:
            report(path + (key,), f"{bad_key}: {problem}")
            continue
        yield key, path + (key,), value


class Checker:
    """Collects problems while section parsers read the parsed document."""

    def __init__(self, text: str, source: str, sections: tuple[Section, ...]):
        self.source = source
        self.text = text
        self.sections = sections
        self._lines: LineMap | None = None
        self.problems: list[Problem] = []

    @property
    def lines(self) -> LineMap:
        """The line map, made on the first problem (a valid file never needs it)."""
        if self._lines is None:
            self._lines = LineMap(self.text)
        return self._lines

    def add(self, path: KeyPath, message: str) -> None:
        self.problems.append(Problem(self.source, self.lines.line_of(path), dotted(path), message))

    def add_outside(self, source: str, key: str, message: str) -> None:
        """A problem that is not in the file (an environment variable): it has no line."""
        self.problems.append(Problem(source, None, key, message))

    def table(self, data: Table, path: KeyPath, schema: KeyPath | None = None) -> Table:
        """The sub-table at `path` (empty if absent); reports unknown keys and a non-table value.

        `schema` is the section path whose keys are known there when it differs from `path`
        (`("harness", "*")` for `("harness", "codex")`).
        """
        value = data.get(path[-1], {}) if path else data
        if not isinstance(value, dict):
            self.add(path, f"must be a table, not {kind(value)}")
            return {}
        known = known_keys(self.sections, path if schema is None else schema)
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

    def run(self, path: KeyPath, check: Check[T], value: object) -> T | None:
        """check(value, where) or None, recording the ConfigError/UsageError it raises."""
        try:
            return check(value, where=dotted(path))
        except UsageError as err:
            prefix = dotted(path) + ": "
            message = err.message[len(prefix) :] if err.message.startswith(prefix) else err.message
            self.add(path, message)
            return None

    def raise_problems(self) -> None:
        """Raise ConfigProblems when anything was found: in file order, as an editor walks them;
        those without a line (the environment) last."""
        if self.problems:
            raise ConfigProblems(
                sorted(self.problems, key=lambda p: p.line if p.line is not None else math.inf)
            )
