"""`python killed_at_started.py MARKS [ccsup arguments...]`: ccsup that SIGKILLs itself the moment
it has published `turn.<id>.started` of a turn not yet named in the file MARKS (the id is added
first, so each turn is killed for once, and a supervisor started again goes on).

For the test that a turn is adoptable from the first instant after `started`:
a kill from outside comes only after a client has read the event, by when the guard has usually
caught up; this one comes before anything else the supervisor does.
"""

from __future__ import annotations

import os
import signal
import sys

from supervisor.cli import main
from supervisor.daemon import server

marks_path = sys.argv.pop(1)
real_publish = server.Server.publish


def publish_then_die(self, topic: str, fields: dict) -> None:
    real_publish(self, topic, fields)
    if topic.startswith("turn.") and topic.endswith(".started"):
        turn = topic[len("turn.") : -len(".started")]
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
