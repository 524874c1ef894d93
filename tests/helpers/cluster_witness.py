"""A turn's command for the cluster tests (holds no test): `python cluster_witness.py DIR SECONDS`.

While it runs it holds an exclusive flock on DIR/<turn>.alive, which the kernel drops when it
dies, however it dies. When it begins it counts the .alive files that are locked (itself included)
and appends `begin <turn> <CLOCK_MONOTONIC> <running> <turns>` to DIR/witness (<turns>: the
running turns' ids, comma-separated): the number running can only grow when one begins, so the
largest count seen at a begin is the most that ever ran at once on this machine's clock.
SECONDS < 0: run until ended.
"""

import fcntl
import os
import sys
import time

directory, seconds = sys.argv[1], float(sys.argv[2])
turn = os.environ["CCSUP_TURN"]
mine = os.open(os.path.join(directory, f"{turn}.alive"), os.O_CREAT | os.O_RDWR, 0o644)
fcntl.flock(mine, fcntl.LOCK_EX)
running, names = 0, []
for name in os.listdir(directory):
    if not name.endswith(".alive"):
        continue
    fd = os.open(os.path.join(directory, name), os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        running += 1
        names.append(name.removesuffix(".alive"))
    finally:
        os.close(fd)
line = f"begin {turn} {time.monotonic()} {running} {','.join(sorted(names))}\n"
out = os.open(os.path.join(directory, "witness"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
os.write(out, line.encode())
os.close(out)
if seconds < 0:
    while True:
        time.sleep(3600)
time.sleep(seconds)
