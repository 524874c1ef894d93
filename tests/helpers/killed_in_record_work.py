"""`python killed_in_record_work.py MARKS [ccsup arguments...]`: ccsup that SIGKILLs itself when it
is about to name a turn's guard in the turn's slot (supervisor.slots.gate.Slot.record_work), once
that guard runs CMD (its record names `own_group`), for each turn not yet named in the file MARKS
(the id is added first, so each turn is killed for once and a supervisor started again goes on).

That is the window between a guard's start and its slot's record: CMD runs, and the slot names
only the turn's cgroup (Slot.name_cgroup). A kill from outside lands there only by chance (about
1 in 20 under load); this lands there every time.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from supervisor.cli import main
from supervisor.slots import gate

marks_path = sys.argv.pop(1)
real_record_work = gate.Slot.record_work


def die_first(self, guard, record_path, groups, cgroup=None, *, command=None):
    turn = self.record.get("turn")
    try:
        with open(marks_path) as f:
            done = set(f.read().split())
    except FileNotFoundError:
        done = set()
    if isinstance(turn, str) and turn not in done and record_path:
        with open(marks_path, "a") as f:
            f.write(turn + "\n")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the guard runs CMD: its record says so
            try:
                if json.loads(Path(record_path).read_text()).get("own_group"):
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.005)
        os.kill(os.getpid(), signal.SIGKILL)
    real_record_work(self, guard, record_path, groups, cgroup, command=command)


gate.Slot.record_work = die_first  # type: ignore[method-assign]

if __name__ == "__main__":
    main()
