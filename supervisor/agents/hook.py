"""The hook a harness runs before every shell command: `ccsup hook run <harness>`, and the fast
form that `ccsup hook install` writes, `python -S .../fast_hook.py <harness> [--key K]
[--match P]...` (a three-line script that imports this module from its cached bytecode).

Its stdin is the harness's hook JSON (supervisor.agents.harnesses). A command that matches no rule
(supervisor.agents.rules) passes untouched: empty output, exit 0, having imported only the
standard library (`-S` skips site, whose .pth processing alone costs more than the rest). A
matching command goes through ccsup:

1. the supervisor is asked for a reservation of the key for the session (holder labels: session,
   harness); no supervisor running: `[hooks] when_down` ("pass": the command runs as it would
   have without ccsup, said once per session in the hook log; "refuse": the model is told);
2. held: the command is rewritten to bind it, `<python> -m supervisor run --key K --reservation R
   --pass-env --session S --harness H -- <bash> -c '<original>'`, each word quoted by shlex
   (spaces, quotes, `$`, newlines and bytes that are not UTF-8 survive). The harness runs that in
   the agent's cwd with the agent's environment; `--pass-env` hands the environment to the turn
   (the supervisor keeps it out of records, events and history); `ccsup run` passes the output and
   the exit status through;
3. queued: the command is queued as a turn at once (binding the reservation's place, so it keeps
   its age), in the call's cwd with the hook's environment, and the call is refused with "queued
   as <id>, position N; run: ccsup wait <id>": the model runs that, which waits and exits with the
   command's status. A hook never waits for a slot: a harness kills a hook that runs past its
   timeout, and a killed hook lets the command run unqueued.

In Codex, a line that runs `ccsup run` itself (typed by the model, not our rewrite) is refused:
`hook install codex` lets our rewrite's `ccsup run` run outside Codex's sandbox without asking
(supervisor.agents.codex_sandbox), so the same words from the model would too.

A payload that is not JSON or not a shell call, a config that cannot be read, or any failure on
the way leaves the command untouched and writes why to the hook log ($CCSUP_HOOK_LOG, else
$XDG_STATE_HOME/ccsup/hook.log): a broken hook must never stop an agent from working.

State: the hook log (appended, never read back) and one marker file per session that was told the
supervisor is down (`down-<hash>` beside the log; removing it says it again). Nothing else.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and not __package__:  # run by path (the fast form): find the package
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from supervisor.agents import rules  # noqa: E402
from supervisor.agents.hook_log import log, log_path  # noqa: E402, F401 (the hook's own log)

HARNESSES = ("claude", "codex", "opencode")  # as supervisor.agents.harnesses (not imported here)
USAGE = (
    "usage: hook <claude|codex|opencode> [--key K] [--match PATTERN]... [--state-dir D] "
    "[--config C]"
)


# Codex runs our rewrite's `ccsup run` outside its sandbox without asking (the execpolicy rule
# `hook install codex` writes): the same words typed by a model would be run so too.
RUN_REFUSED = (
    "ccsup: run the command itself, as you would without ccsup: this hook sends heavy commands "
    "through ccsup. A line that runs `ccsup run` is not taken from the model here: Codex would "
    "run it outside its sandbox without asking."
)


class Options:
    def __init__(self, argv: list[str]):
        if not argv or argv[0] not in HARNESSES:
            raise ValueError(USAGE)
        self.harness = argv[0]
        self.key: str | None = None
        self.match: list[str] = []
        self.state_dir: str | None = None  # carried by the installed hook (else found as the CLI
        self.config: str | None = None  # finds them: $CCSUP_STATE_DIR, $CCSUP_CONFIG, defaults)
        rest = argv[1:]
        while rest:
            flag = rest.pop(0)
            if flag in ("--key", "--match", "--state-dir", "--config") and rest:
                value = rest.pop(0)
                if flag == "--key":
                    self.key = value
                elif flag == "--match":
                    self.match.append(value)
                elif flag == "--state-dir":
                    self.state_dir = value
                else:
                    self.config = value
            else:
                raise ValueError(f"unknown argument {flag!r}; {USAGE}")


def _settings(table: dict) -> tuple[list[str], bool, str | None, str]:
    """(rules, defaults, key, when_down) from a `[hooks]` table, whatever it holds."""
    extra = table.get("rules", [])
    if not isinstance(extra, list) or not all(isinstance(r, str) for r in extra):
        log("[hooks] rules is not a list of strings; ignored (ccsup config check says more)")
        extra = []
    defaults = table.get("defaults", True)
    key = table.get("key")
    when_down = table.get("when_down", "pass")
    return (
        extra,
        defaults if isinstance(defaults, bool) else True,
        key if isinstance(key, str) else None,
        when_down if when_down in rules.WHEN_DOWN else "pass",
    )


def emit(text: str) -> None:
    import json

    try:
        data = text.encode("utf-8", "surrogateescape")  # bytes that came in not UTF-8 go out as-is
    except UnicodeEncodeError:
        data = json.dumps(json.loads(text)).encode()  # lone surrogates from \u escapes: ASCII JSON
    sys.stdout.buffer.write(data + b"\n")
    sys.stdout.flush()


def _is_our_wait(command: str) -> bool:
    from supervisor.agents.route import ccsup_words  # the slow path: the config is read

    try:
        words = ccsup_words()
    except Exception as e:  # noqa: BLE001 - then it is not ours to approve: the harness decides
        log(f"unable to tell our wait line (config): {e!r}")
        return False
    return rules.is_wait(command, words)


def main(argv: list[str] | None = None) -> int:
    """The hook; whatever happens, exit 0 and, when the command goes on unjudged, a log line (the
    harness then decides as without ccsup: a hook never approves by failing)."""
    try:
        return _main(argv)
    except Exception as e:  # noqa: BLE001 - the last word: said in the log, never a traceback
        log(f"passed to the harness's own decision after a failure: {type(e).__name__}: {e}")
        return 0


def _main(argv: list[str] | None = None) -> int:
    try:
        options = Options(sys.argv[1:] if argv is None else argv)
    except ValueError as e:
        log(str(e))
        return 0
    if options.state_dir:  # the hook's own and every client it makes (route) read them from here
        os.environ["CCSUP_STATE_DIR"] = options.state_dir
    if options.config:
        os.environ["CCSUP_CONFIG"] = options.config
    raw = sys.stdin.buffer.read()
    # In Codex a line that runs `ccsup run` itself is judged even when no rule's word is in it
    codex_ours = options.harness == "codex" and (b"supervisor" in raw or b"ccsup" in raw)
    if (
        not options.match
        and not codex_ours
        and rules.surely_unmatched(raw)
        and not rules.has_hooks_table(os.environ)
    ):
        return 0  # the common case: nothing parsed, no json imported
    import json

    from supervisor.agents import harnesses

    try:
        payload = json.loads(raw.decode("utf-8", "surrogateescape"))
        call = harnesses.parse(options.harness, payload)
    except (ValueError, harnesses.BadPayload) as e:
        log(f"{options.harness}: passed untouched: not a hook payload ({e}): {raw[:200]!r}")
        return 0
    if call is None:
        return 0
    if codex_ours and rules.runs_ccsup_run(call.command):
        emit(harnesses.refuse(options.harness, RUN_REFUSED))
        log(f"codex: refused a line that runs ccsup run itself: {call.command[:200]!r}")
        return 0
    if " wait " in call.command and _is_our_wait(call.command):  # exactly what we told it to run
        allowed = harnesses.allow(options.harness)
        if allowed:
            emit(allowed)
        return 0
    table, problem = rules.read_hooks_table(os.environ)
    if problem:
        log(problem)
    extra, defaults, key, when_down = _settings(table)
    try:
        found = rules.judge(call.command, [*extra, *options.match], defaults=defaults)
    except rules.RuleError as e:
        log(f"{e}; using the default rules alone")
        found = rules.judge(call.command, [], defaults=True)
    except Exception as e:  # noqa: BLE001 - unjudged, it runs as the harness decides: say so
        log(f"{options.harness}: passed to the harness's own decision, not judged: {e!r}")
        return 0
    if found is None:
        return 0
    from supervisor.agents.route import route  # the slow path: the client, zmq, the config

    try:
        out = route(options.harness, call, options.key or key, when_down, found)
    except Exception as e:  # noqa: BLE001 - a broken hook must never stop an agent: pass, say why
        log(f"{options.harness}: passed untouched after a failure: {type(e).__name__}: {e}")
        return 0
    if out:
        emit(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
