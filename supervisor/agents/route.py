"""The hook's slow path, for a command that matched a rule: reserve, then rewrite or queue.

See supervisor.agents.hook for the whole story. `route` answers the hook JSON to print (or None
to pass untouched); it raises on a failure, which the hook logs and passes.

State: a reservation or a queued turn in the supervisor (nothing here); the down-marker per
session beside the hook log.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import sys
import time
import uuid

from supervisor.agents import harnesses
from supervisor.agents.harnesses import Call
from supervisor.agents.hook_log import log, log_path
from supervisor.agents.rules import Match

TYPE_CHECKING = False
if TYPE_CHECKING:
    from supervisor.client.control import Client


_site_done: list[bool] = []


def _full_site() -> None:
    """The fast form runs with -S: the dependencies (zmq, click) need site's paths now (once)."""
    if sys.flags.no_site and not _site_done:
        import site

        site.main()
        _site_done.append(True)


def shell() -> str:
    """The shell that runs the original command: bash, as the harnesses' shell tools use, else sh."""
    return shutil.which("bash") or "/bin/sh"


def ccsup_words() -> list[str]:
    """How to run this ccsup on this supervisor, whatever PATH or the shell's environment holds
    (a login shell's profile may reset PATH): its own Python by absolute path, its package, and the
    state directory and config file the hook uses, both absolute."""
    _full_site()
    from supervisor import config as cfg
    from supervisor.agents.rules import config_path

    config = cfg.load(None, os.environ)
    state_dir = cfg.resolve_state_dir(None, os.environ, config)
    words = [sys.executable, "-m", "supervisor", "--state-dir", os.path.abspath(state_dir)]
    path = config_path(os.environ)
    if path is not None:
        words += ["--config", os.path.abspath(path)]
    return words


def wait_hint(turn_id: str) -> str:
    """The line the refusal tells the model to run; the hook approves exactly this line
    (supervisor.agents.rules.is_wait): our interpreter by absolute path, never PATH's ccsup."""
    return shlex.join([*ccsup_words(), "wait", turn_id])


def rewritten(
    command: str, key: str, reservation: str | None, session: str | None, harness: str
) -> str:
    words = [*ccsup_words(), "run", "--key", key]
    if reservation:
        words += ["--reservation", reservation]
    words.append("--pass-env")
    if session:
        words += ["--session", session]
    words += ["--harness", harness, "--", shell(), "-c", command]
    return " ".join(shlex.quote(w) for w in words)


def _say_down_once(session: str | None, state_dir: object) -> bool:
    """True the first time a session meets no supervisor (a marker beside the hook log)."""
    name = hashlib.sha256((session or "").encode("utf-8", "surrogateescape")).hexdigest()[:16]
    marker = os.path.join(os.path.dirname(log_path()), f"down-{name}")
    if os.path.exists(marker):
        return False
    log(f"no supervisor running on {state_dir}: commands of session {session!r} run without ccsup")
    try:
        os.makedirs(os.path.dirname(marker), exist_ok=True)
        with open(marker, "w"):
            pass
    except OSError:
        pass
    return True


def not_plain(harness: str, call: Call, key: str, found: Match) -> str:
    """A line the rules take that is not one plain simple command: the harness keeps its own
    decision. Claude Code gets the rewrite with "ask" (its prompt, or its refusal where nobody can
    be asked, judges the rewritten line); Codex applies a rewrite only with "allow" and OpenCode's
    permission rules would see only our wrapper, so there the model is told to run the heavy
    command on its own (then it is plain, and runs capped)."""
    reason = f"ccsup: runs as a turn of {key} (rule: {found.name})"
    if harness == "claude":
        new = rewritten(call.command, key, None, call.session, harness)
        return harnesses.rewrite(harness, call, new, reason, decision="ask")
    heavy = f"`{shlex.join(found.heavy)}`" if found.heavy else "the heavy command"
    # The line as the agent wrote it, run through ccsup explicitly: capped, and judged by the
    # harness as any other command (a line that starts with ccsup passes the hook untouched).
    capped = rewritten(call.command, key, None, call.session, harness)
    return harnesses.refuse(
        harness,
        f"ccsup: this line runs {heavy} (rule: {found.name}), and ccsup approves by itself only "
        "one plain command found on the PATH, with no other shell around it (no ;, &&, ||, |, &, "
        "newline, $(...), backticks, heredoc, redirection into a file, ./path, or assignment such "
        f"as PATH=). Run {heavy} on its own, or run the line capped as it is: {capped}",
    )


# How long the hook waits for a supervisor that is restarting (its start under way, or guards
# waiting for adoption): within the hook timeout `ccsup hook install` writes (30 s) for every
# harness, with room for the reservation after it.
RESTART_WAIT = 15.0
RESTARTING = "ccsup is restarting: run it again in a few seconds"


class _Restarting(Exception):
    """The supervisor did not come back within RESTART_WAIT."""


def restarting(client: Client) -> bool:
    """Whether a supervisor is on its way: its lock held while its control socket is not there
    yet (a start under way), or guards waiting for adoption (a crash; the next start adopts
    them). Either way `when_down` is not for this moment: nothing caps a command let through
    now, while the guards' turns still hold their work."""
    from supervisor.guards import waiting
    from supervisor.instance import lock_held

    if lock_held(client.paths.lock):
        return True
    return waiting.survey(client.paths.guards).count > 0


def _up(client: Client, deadline: float) -> bool:
    """True once a supervisor runs; False when none runs nor is on its way (`when_down`);
    _Restarting when one is on its way but did not come by the deadline."""
    said = False
    while not client.running():
        if not restarting(client):
            return False
        if not said:
            log(f"the supervisor on {client.state_dir} is restarting: waiting for it")
            said = True
        if time.monotonic() >= deadline:
            raise _Restarting
        time.sleep(0.1)
    return True


def _reserve(client: Client, key: str, holder: dict, deadline: float) -> dict | None:
    """The key's reservation, asked again while a restarting supervisor does not answer yet;
    None when no supervisor runs any more (then `when_down`)."""
    from supervisor.client.control import RemoteError
    from supervisor.errors import CcsupError

    while True:
        client.timeout = max(1.0, min(5.0, deadline - time.monotonic()))
        try:
            return client.reserve(key, holder=holder)
        except RemoteError:
            raise
        except CcsupError:  # not answering yet (a start under way), or gone again
            client.drop_requests()
            if time.monotonic() >= deadline:
                raise _Restarting from None
            if not _up(client, deadline):
                return None


def route(harness: str, call: Call, key: str | None, when_down: str, found: Match) -> str | None:
    try:
        return _route(harness, call, key, when_down, found)
    except _Restarting:
        log(f"{harness}: refused: the supervisor did not come back within {RESTART_WAIT:g} s")
        return harnesses.refuse(harness, RESTARTING)


def _route(harness: str, call: Call, key: str | None, when_down: str, found: Match) -> str | None:
    _full_site()
    from supervisor import config as cfg
    from supervisor.client.control import Client
    from supervisor.wire.protocol import passed_env

    config = cfg.load(None, os.environ)
    state_dir = cfg.resolve_state_dir(None, os.environ, config)
    the_key = key or os.environ.get("CCSUP_KEY") or "default"
    holder = {"harness": harness, **({"session": call.session} if call.session else {})}
    deadline = time.monotonic() + RESTART_WAIT
    with Client(state_dir, endpoints=config.endpoints.resolve(state_dir)) as client:
        answer = None
        if _up(client, deadline) and found.plain:
            answer = _reserve(client, the_key, holder, deadline)
        if answer is None and not client.running():
            told = _say_down_once(call.session, state_dir)
            if when_down == "refuse":
                return harnesses.refuse(
                    harness,
                    f"ccsup: no supervisor is running on {state_dir}, and [hooks] when_down is "
                    f"refuse: start it with `ccsup start`, then run the command again",
                )
            if told and harness == "claude":
                return (
                    '{"systemMessage": "ccsup: no supervisor is running; heavy commands run '
                    'without its cap until one is started (ccsup start)"}'
                )
            return None
        if not found.plain:
            return not_plain(harness, call, the_key, found)
        if answer is None:  # gone, and back again, within this call
            raise _Restarting
        reservation = str(answer["reservation"])
        if answer.get("state") == "held":
            new = rewritten(call.command, the_key, reservation, call.session, harness)
            return harnesses.rewrite(
                harness, call, new, f"ccsup: runs as a turn of {the_key} (rule: {found.name})"
            )
        turn_id = uuid.uuid4().hex
        reply = client.turn(
            the_key,
            [shell(), "-c", call.command],
            id=turn_id,
            cwd=call.cwd or os.getcwd(),
            env=passed_env(),
            holder=holder,
            reservation=reservation,
        )
        position = reply.get("position") or answer.get("position")
    return harnesses.refuse(
        harness,
        f"ccsup: the machine is busy: your command is queued as {turn_id}, position {position} "
        f"of key {the_key}; it will run by itself. Run: {wait_hint(turn_id)} (it waits and "
        "exits with the command's status; run it again if it times out). Do not run the command "
        "again.",
    )
