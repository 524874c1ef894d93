"""CMDs for the guard's tests, run as `python tests/helpers/guard_cmds.py ACTION [ARGS]` (holds no test).

Every process it starts prints one line `<role> <pid> <start ticks> <pgid>` to stdout (the guard's
stdout, a pipe the test reads) before the test acts on it, so no test sleeps a fixed time.
"""

import os
import signal
import sys
import time

from guardd.procs import start_ticks


def announce(role):
    pid = os.getpid()
    os.write(1, f"{role} {pid} {start_ticks(pid)} {os.getpgrp()}\n".encode())


def forever():
    while True:
        signal.pause()


def setsid_child():
    """A child in a session (and group) of its own that ignores SIGTERM."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.setsid()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        announce("child")
        os.write(w, b"x")
        forever()
    os.close(w)
    os.read(r, 1)  # announced before the parent goes on
    os.close(r)
    return pid


def daemon():
    """Double fork and setsid: the daemon ends up orphaned, its group's leader gone."""
    r, w = os.pipe()
    mid = os.fork()
    if mid == 0:
        os.setsid()
        if os.fork() == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            os.close(r)
            announce("daemon")
            os.write(w, b"x")
            forever()
        os._exit(0)
    os.close(w)
    os.read(r, 1)  # the daemon is up (and has announced itself)
    os.waitpid(mid, 0)  # the middle process is gone: the daemon is an orphan now


def tree(fanout, depth):
    """A forking tree of fanout + fanout**2 + ... + fanout**depth processes. Odd children start a
    session of their own and ignore SIGTERM; every third parent of leaves exits once its leaves
    are up, leaving them orphans for the subreaper."""
    kids = []
    for i in range(fanout if depth > 0 else 0):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            if i % 2:
                os.setsid()
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            tree(fanout, depth - 1)
            announce("node")
            os.write(w, b"x")
            os.close(w)
            if depth == 2 and i % 3 == 0:
                os._exit(0)
            forever()
        os.close(w)
        os.read(r, 1)
        os.close(r)
        kids.append(pid)
    return kids


def main():
    action, args = sys.argv[1], sys.argv[2:]
    if action == "exit-after-orphan":
        # CMD exits with args[0]; a child of it exits with 3 after CMD, as the guard's orphan.
        if os.fork() == 0:
            time.sleep(0.1)
            os._exit(3)
        os._exit(int(args[0]))
    if action == "orphan-exits-first":
        pid = os.fork()
        if pid == 0:
            if os.fork() == 0:
                os._exit(4)  # orphan of a dead parent: reparented to the guard, exits 4
            os._exit(5)
        os.waitpid(pid, 0)
        time.sleep(0.2)
        os._exit(int(args[0]))
    if action == "setsid-child":
        setsid_child()
        announce("ready")
        if args and args[0] == "stay":
            forever()
        os._exit(int(args[0]) if args else 0)
    if action == "daemon":
        daemon()
        announce("ready")
        if args and args[0] == "stay":
            forever()
        os._exit(0)
    if action == "sleep":
        announce("ready")
        forever()
    if action == "tree":
        fanout, depth = int(args[0]), int(args[1])
        tree(fanout, depth)
        announce("ready")
        if args[2:] == ["exit"]:
            os._exit(0)
        forever()
    raise SystemExit(f"unknown action {action}")


if __name__ == "__main__":
    main()
