"""`python no_zygote.py [ccsup arguments...]`: ccsup whose guard zygote can never start (its launch
raises OSError), so that every guard is started directly, as our child with no zygote above it.

For the test that a directly started guard's strays never escape: the supervisor,
a child subreaper, ends them before the guard's exit is handed on (supervisor.guards.strays).
"""

from __future__ import annotations

from functools import partial

from supervisor.cli import main
from supervisor.daemon import main as daemon_main


def no_zygote(python=None):
    raise OSError("no zygote (tests/helpers/no_zygote.py)")


daemon_main.Launcher = partial(daemon_main.Launcher, launch_zygote=no_zygote)  # type: ignore[misc]
main(prog_name="ccsup")
