"""`[web]`: the live page (`ccsup web`): where it listens beside the supervisor, and its token.

The checks themselves (what a listen address is, when a token is needed) live with the page, in
supervisor.web.settings; this module places them in the file, with their keys and lines.
"""

from __future__ import annotations

from ..web.settings import DOCS, WebSettings, parse_web
from .schema import Checker, Key, Section, Table

SECTION = Section(
    ("web",),
    "The live page (`ccsup web`), a client of the supervisor.",
    tuple(Key(name, value, doc, example=True) for name, value, doc in DOCS),
    example=True,
)


def parse_web_section(c: Checker, top: Table) -> WebSettings:
    settings, problems = parse_web(c.table(top, ("web",)))
    for path, message in problems:
        c.add(path, message)
    return settings
