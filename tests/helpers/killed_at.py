"""`python killed_at.py EVENT MARKS [ccsup arguments...]`: ccsup that SIGKILLs itself the moment it
has published `turn.<id>.<EVENT>` of a turn not yet named in the file MARKS (the id is added first,
so each turn is killed for once, and a supervisor started again goes on).

A kill from outside comes only after a client has read the event, by when the supervisor has
usually done more; this one comes before anything else the supervisor does. EVENT `started`: a
turn adoptable from the first instant (tests/system/test_adoption.py). EVENT `granted`: a turn
granted whose guard had not started (tests/system/test_rerun.py): the grant is saved and published
before its guard is asked for (supervisor.turns.manager.start_saved_grants), so dying in the
publish leaves exactly that turn, every time, with no fixed sleep.
"""

from __future__ import annotations

import os
import signal
import sys

from supervisor.cli import main
from supervisor.daemon import server

suffix = "." + sys.argv.pop(1)
marks_path = sys.argv.pop(1)
real_publish = server.Server.publish


def publish_then_die(self, topic: str, fields: dict) -> None:
    real_publish(self, topic, fields)
    if topic.startswith("turn.") and topic.endswith(suffix):
        turn = topic[len("turn.") : -len(suffix)]
        try:
            with open(marks_path) as f:
                done = set(f.read().split())
        except FileNotFoundError:
            done = set()
        if turn not in done:
            with open(marks_path, "a") as f:
                f.write(turn + "\n")
            os.kill(os.getpid(), signal.SIGKILL)


server.Server.publish = publish_then_die  # type: ignore[method-assign]

if __name__ == "__main__":
    main()
