"""A turn that holds memory: `memhog.py MIB SECONDS [MARKER_DIR] [CHILDREN]`.

Allocates MIB MiB, every page written, holds it SECONDS, then exits 0. With MARKER_DIR it writes
`<pid>` there holding "<touched at> <releasing at>" (epoch seconds) just before it exits, so a test
can tell, from outside, how many held their memory at once. With CHILDREN it holds nothing
itself: it starts that many copies of itself (each MIB, SECONDS) and waits for them all.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time


def main() -> int:
    mib, seconds = int(sys.argv[1]), float(sys.argv[2])
    marker = sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] != "-" else None
    children = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    if children:
        procs = [
            subprocess.Popen([sys.executable, __file__, str(mib), str(seconds), marker or "-"])
            for _ in range(children)
        ]
        return max(p.wait() for p in procs)
    held = b"\x01" * (mib << 20)  # one allocation, every page written
    touched = time.time()
    time.sleep(seconds)
    released = time.time()
    if marker:
        with open(os.path.join(marker, str(os.getpid())), "w") as f:
            f.write(f"{touched} {released}\n")
    del held
    return 0


if __name__ == "__main__":
    sys.exit(main())
