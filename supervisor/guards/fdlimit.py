"""The daemon's open-file limit: raised to the hard limit at start, given back to every turn.

Five hundred running turns hold about 5,000 descriptors in the supervisor (three pipes and a
pidfd per guard, log files, sockets): more than the usual soft RLIMIT_NOFILE of 1024. The daemon
raises its soft limit to the hard one (an unprivileged process may) once, at start. Its children
inherit the raised limit, and a turn's tools must not: select() breaks on descriptors above 1024.
So the daemon's environment carries `CCSUP_GUARD_NOFILE=<the soft limit it started with>`; every
guard it starts (directly or through the zygote) gets that environment, takes the variable out of
CMD's environment and sets CMD's soft limit back to it just before exec (guardd.child). A turn thus
starts with the limit it would have had without ccsup.

Knows getrlimit/setrlimit and that one variable; nothing of guards or turns. Stateless: a
restarted daemon raises its own limit again (the variable it set is then replaced by the same
value, read from the limit it started with).
"""

from __future__ import annotations

import logging
import os
import resource

from guardd.child import NOFILE_ENV

log = logging.getLogger("ccsup.fdlimit")


def raise_nofile() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit; returns (soft before, soft now).

    The soft limit before is left in $CCSUP_GUARD_NOFILE for the guards to give back to CMD (an
    inherited value wins: a supervisor started by a turn gives CMD the turn's caller's limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    os.environ.setdefault(NOFILE_ENV, str(soft))
    if hard != resource.RLIM_INFINITY and soft >= hard:
        return soft, soft
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (OSError, ValueError) as e:
        log.warning("unable to raise the open-file limit from %d to %d: %s", soft, target, e)
        return soft, soft
    log.info("open-file limit raised from %d to %d (turns get %d back)", soft, target, soft)
    return soft, target
