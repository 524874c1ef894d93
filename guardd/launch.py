"""The command line that starts a guard cheaply: `guard_command(args) -> argv` for Popen.

Design note. `python -m guardd` runs `site`, which in an editable install also imports setuptools'
finder (with re, pathlib and more): 11-23 ms of every turn here. A guard needs nothing from
site-packages (its hints speak ZMTP themselves), so it is started as `python -I -S -c BOOTSTRAP`,
where BOOTSTRAP appends the directory that holds this very `guardd` package to sys.path and calls
`guardd.__main__.main()`. Appended, not prepended: for a regular install that directory is
site-packages, which must not shadow the standard library; with -I and -S nothing else is on the
path, so the guardd found is this one (a `guardd.py` in the turn's cwd is never looked at).
`sys.executable` by default: a `python3` shim on PATH can cost 90 ms a start.

The guard zygote (guardd.zygote) is started the same way, with ZYGOTE_BOOTSTRAP.

Stateless.
"""

from __future__ import annotations

import os
import sys

_HOME = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BOOTSTRAP = (
    f"import sys; sys.path.append({_HOME!r}); from guardd.__main__ import main; sys.exit(main())"
)


ZYGOTE_BOOTSTRAP = (
    f"import sys; sys.path.append({_HOME!r}); from guardd.zygote import main; sys.exit(main())"
)


def guard_command(args: list[str], python: str | None = None) -> list[str]:
    """argv that runs `ccsup-guard ARGS...` with this interpreter, isolated and without site."""
    return [python or sys.executable, "-I", "-S", "-c", BOOTSTRAP, *args]


def zygote_command(args: list[str], python: str | None = None) -> list[str]:
    """argv that runs the guard zygote (guardd.zygote) with this interpreter, like a guard."""
    return [python or sys.executable, "-I", "-S", "-c", ZYGOTE_BOOTSTRAP, *args]
