"""One soak client: submits, cancels and reserves turns for `seconds`, riding out a supervisor restart.

    python soak_client.py STATE_DIR N SECONDS TURN_CMD...

Writes every id the supervisor acknowledged to STATE_DIR/acked-N, one per line. Not a test.
"""

import random
import sys
import time

from supervisor.client import Client, RemoteError
from supervisor.errors import CcsupError


def main() -> None:
    state_dir, n, seconds, turn_cmd = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4:]
    rng = random.Random(int(n))
    acked = open(f"{state_dir}/acked-{n}", "a", buffering=1)
    end = time.monotonic() + seconds
    client = Client(state_dir, timeout=2.0)
    mine: list[str] = []
    count = 0

    def call(method, *args, **kwargs):
        """Retry through a supervisor restart: requests are idempotent by id."""
        nonlocal client
        while True:
            try:
                return method(client)(*args, **kwargs)
            except RemoteError:
                raise
            except CcsupError:
                client.close()
                time.sleep(0.1)
                client = Client(state_dir, timeout=2.0)

    while time.monotonic() < end:
        count += 1
        item_id = f"c{n}-{count}"
        roll = rng.random()
        holder = {"session": f"s{n}", "agent": f"a{count}"}
        if roll < 0.15 and mine:
            call(lambda c: c.cancel, rng.choice(mine))
            continue
        if roll < 0.30:
            answer = call(lambda c: c.reserve, "soak", holder=holder, id=f"{item_id}r")
            acked.write(f"{item_id}r reserve\n")
            if rng.random() < 0.7:
                call(
                    lambda c: c.turn,
                    "soak",
                    turn_cmd,
                    id=item_id,
                    holder=holder,
                    reservation=answer["reservation"],
                )
                acked.write(f"{item_id} turn\n")
                mine.append(item_id)
            continue
        call(
            lambda c: c.turn,
            "soak",
            turn_cmd,
            id=item_id,
            holder=holder,
            wait_timeout=rng.choice([None, None, 5.0]),
        )
        acked.write(f"{item_id} turn\n")
        mine.append(item_id)
        time.sleep(rng.uniform(0.05, 0.25))
    client.close()


if __name__ == "__main__":
    main()
