"""`python failing_duties.py RUNS [ccsup arguments...]`: ccsup whose every periodic duty raises
at its first run (RuntimeError "injected failure of <name>"); each later run appends the duty's
name to the file RUNS, then does the duty's work. Prunes come every 0.2 s instead of 5 min.

For the test that each periodic duty survives an exception: a real supervisor,
with a fault put in where no outside fault reaches each duty.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from supervisor.cli import main
from supervisor.daemon import main as daemon_main
from supervisor.output import retention

runs_path = sys.argv.pop(1)
retention.PRUNE_INTERVAL = 0.2
real_duties = daemon_main.Daemon._periodic_duties


def failing_once(name: str, duty: Callable[[], object]) -> Callable[[], object]:
    failed = False

    def run() -> object:
        nonlocal failed
        if not failed:
            failed = True
            raise RuntimeError(f"injected failure of {name}")
        with open(runs_path, "a") as runs:
            runs.write(f"{name}\n")
        return duty()

    return run


def duties(self: daemon_main.Daemon) -> dict[str, tuple[str, Callable[[], object]]]:
    return {
        name: (what, failing_once(name, duty)) for name, (what, duty) in real_duties(self).items()
    }


daemon_main.Daemon._periodic_duties = duties  # type: ignore[method-assign]
main(prog_name="ccsup")
