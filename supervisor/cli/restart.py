"""`ccsup restart`: the planned hand-over (how an upgrade is done). The running supervisor saves
everything and exits without ending a turn; a new one, from the code installed now, is started as
`ccsup start` would start it (the same config, caps and state directory) and adopts the turns;
this returns once it has adopted every one.

Exit codes: 0 every turn adopted; 1 the hand-over was refused (`[guard] adopt_within` is 0, it
is stopping already, or it is of a release before adoption, which cannot hand over), the old
supervisor did not exit, or not every turn was adopted within --timeout (named); 3 no supervisor
was running (none is started: that is `ccsup start`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import click

from ..client.control import RemoteError
from ..errors import CcsupError
from .options import DURATION
from .where import where

if TYPE_CHECKING:
    from ..client.control import Client

DEFAULT_TIMEOUT = 30.0  # seconds, where the supervisor does not say its adopt_within
SHOWN = 10  # turns named at most when some were not adopted


@click.command()
@click.option(
    "--timeout",
    type=DURATION,
    default=None,
    help="How long to wait for the new supervisor to adopt every turn (default: [guard] "
    "adopt_within, 30s).",
)
@click.option(
    "--force",
    is_flag=True,
    help="Without asking, end what the running supervisor cannot hand over: turns on a terminal "
    "(-t) of a supervisor of an earlier release, which did not adopt them (this one does).",
)
@click.pass_context
def restart(ctx: click.Context, timeout: float | None, force: bool) -> None:
    """Hand the running turns over to a new supervisor (an upgrade): none of them ends.

    The running supervisor saves everything and exits, leaving each turn's guard waiting to be
    adopted ([guard] adopt_within); a new one is started from the code installed now, with the
    same config, and adopts them. Returns once every turn is adopted. `ccsup stop` still ends
    everything. Turns on a terminal (-t) are adopted too; a supervisor of an earlier release,
    which could not hand them over, is asked before they end (on a terminal), else needs
    --force."""
    from .start import spawn_supervisor, wait_until_answering

    options = where(ctx)
    began = time.monotonic()
    with options.client() as client:
        status = client.status()  # NotRunning (exit 3) when none runs: none is started
        started = status.get("started_with") or {}
        if started.get("systemd"):
            raise CcsupError(
                f"the supervisor on {client.state_dir} (pid {status.get('pid')}) runs under "
                "systemd: hand it over with `systemctl --user restart ccsup` (its unit sends "
                "SIGUSR2, the same hand-over), so that systemd starts the next one"
            )
        if "adopt_within" not in status:  # a release before adoption: no hand-over
            raise CcsupError(
                f"the supervisor on {client.state_dir} (pid {status.get('pid')}, version "
                f"{status.get('version', '?')}) is of a release that cannot hand its turns over: "
                "nothing was changed; `ccsup stop` (it ends them) and then `ccsup start` starts "
                "this one, or wait until they are done"
            )
        if not status.get("adopt_within"):
            client.quit(handover=True)  # refused by the supervisor, which says why
        limit = timeout if timeout is not None else float(status.get("adopt_within") or 0)
        limit = limit or DEFAULT_TIMEOUT
        state_dir = client.state_dir
        # The new supervisor starts now and waits for the lock: its start-up (the interpreter and
        # its imports) is spent while the old one hands over, not while nobody answers.
        child = spawn_supervisor(state_dir, started.get("config"), started.get("caps"), limit)
        try:
            # refused: adopt_within is 0, stopping already, or (an earlier release) terminal turns
            # would end
            answer = client.quit(handover=True, force=force)
        except RemoteError as e:
            child.kill()
            child.wait()
            if e.code != "conflict" or not _confirmed(e.message):
                raise CcsupError(e.message) from None
            child = spawn_supervisor(state_dir, started.get("config"), started.get("caps"), limit)
            try:
                answer = client.quit(handover=True, force=True)
            except BaseException:
                child.kill()
                child.wait()
                raise
        except BaseException:
            child.kill()
            child.wait()
            raise
    old_pid = answer.get("pid", status.get("pid"))
    handed = int(answer.get("turns") or 0)
    if answer.get("ending"):
        click.echo(
            f"ccsup: {answer['ending']} turn(s) end with the old supervisor: cluster-capped "
            "turns are not adopted (nor, by a supervisor of an earlier release, turns on a "
            "terminal)",
            err=True,
        )
    new_pid = wait_until_answering(options, child, state_dir, "adopting the turns")
    with options.client() as client:
        adopted, waiting = _wait_adopted(client, handed, began + limit)
        took = time.monotonic() - began
        if adopted < handed or waiting:
            raise CcsupError(
                f"restarted: pid {old_pid} -> {new_pid}, but only {adopted} of {handed} turn(s) "
                f"were adopted in {limit:g} s ({waiting} guard(s) still waiting); "
                + _not_adopted(client, answer.get("ids") or [])
            )
    click.echo(
        f"restarted: pid {old_pid} -> {new_pid}, adopted {adopted} of {handed} turns in {took:.1f} s"
    )


def _confirmed(refusal: str) -> bool:
    """On a terminal, ask whether to end the terminal turns the supervisor named; elsewhere no."""
    import sys

    if not sys.stdin.isatty():
        return False
    click.echo(f"ccsup: {refusal}", err=True)
    return click.confirm("End them and restart?", default=False, err=True)


def _wait_adopted(client: Client, handed: int, deadline: float) -> tuple[int, int]:
    """(adopted, guards still waiting) once every turn is adopted, else at the deadline."""
    adopted = waiting = 0
    while True:
        try:
            status = client.status()
        except CcsupError:
            status = {}  # not answering yet (it answered `start` once): asked again
        adopted = int(status.get("adopted") or 0)
        waiting = int(status.get("waiting_adoption") or 0)
        if status and adopted >= handed and not waiting:
            return adopted, waiting
        if time.monotonic() >= deadline:
            return adopted, waiting
        time.sleep(0.02)


def _not_adopted(client: Client, ids: list[Any]) -> str:
    """The handed-over turns whose slot the new supervisor does not hold (by its `ps`)."""
    try:
        ps = client.ps()
    except CcsupError as e:
        return f"unable to ask which: {e.message}"
    held = {s.get("turn") for s in ps.get("slots", []) if s.get("state") == "held"}
    missing = [str(i) for i in ids if i not in held]
    if not missing:
        return "see `ccsup ps`"
    named = ", ".join(missing[:SHOWN]) + (
        f" and {len(missing) - SHOWN} more" if len(missing) > SHOWN else ""
    )
    return f"not adopted: {named}"
