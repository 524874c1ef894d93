"""`python killed_at_granted.py MARKS [ccsup arguments...]`: ccsup that SIGKILLs itself the moment
it has published `turn.<id>.granted` of a turn not yet named in the file MARKS (the id is added
first, so each turn is killed for once, and a supervisor started again goes on).

For the tests of a turn granted whose guard had not started when its supervisor died
(tests/system/test_rerun.py): the grant is saved and published before its guard is asked for
(supervisor.turns.manager.start_saved_grants), so dying in the publish leaves exactly that turn,
every time, with no fixed sleep.
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
    if topic.startswith("turn.") and topic.endswith(".granted"):
        turn = topic[len("turn.") : -len(".granted")]
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
