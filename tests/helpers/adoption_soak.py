"""The adoption soak (its "Done when"): a supervisor SIGKILLed at random moments, while
turns are requested, granted, started and exiting, and started again; then counted from outside.
Used by tests/system/test_adoption_soak.py (short) and tests/bench/bench_adoption_soak.py (5 min).

    run_soak(state_dir, seconds=..., seed=...) -> the counts (a dict, one JSON line's worth)
    python adoption_soak.py worker STATE RESULTS N SEED UNTIL RUN    (a client process)
    python adoption_soak.py sample RUN OUT                           (the outside sampler)

The turns: `sh -c` appending `start <id>` to a shared file (O_APPEND), then printing
`<id> <counter>` every 20-50 ms for 0.2-3 s and exiting 0, so its log is checked exactly: every
line once, in order, ending at its last counter. Requested at cap CAP on one key by WORKERS client
processes, each one turn at a time, some by Client.run_turn (its id its own, acknowledged when the
request is answered), some by `ccsup run` (its stdout checked against the log too); and once a
burst of requests from here, the supervisor killed right after their answers.

The supervisor runs with adopt_within 30s; between kills it is started again after 0-1.5 s, and
killed 0-2 s after it answered (seeded: the seed is in the counts). Counted at the end, once all
is quiet, from the history file, the logs, the start marks, `ps` and an outside sampler:
- lost: acknowledged and no terminal state, neither in the history nor in the supervisor's own
  finished.log (`ends_missing_in_history`: finished there, its end missing in the history;
  `misdated_ends`: the history's exited_at more than MISDATED s from the command's end mark);
  `ended_by_restart`: a turn that ended because a supervisor died (`supervisor_restarted`,
  `not_adopted`), its work cut short; `granted_never_ran`: one that ended so without its start
  mark (granted, its guard not started yet when its supervisor was killed: its story ends, and
  it is not asked again);
- run twice: its start mark written twice;
- granted twice: two `granted` events of one turn in one epoch, or one turn in two slots (`ps`,
  every 100 ms while a supervisor answers);
- bytes lost or repeated, in the logs and in what the clients printed; the status a client gave
  for a turn that ran to its end (exit 0): `client_status_wrong` (with `_end_missing`: of a turn
  whose end missed the history, so that a client that rode through could not learn it);
- the most turns alive at once (their processes, from /proc every 10 ms), against the cap.

Not a test itself; the callers assert on the counts. Every process it starts is ended by pid.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

PYTHON = sys.executable
KEY = "soak"
TERMINAL = ("released", "cancelled", "rejected")
CUT_SHORT = ("supervisor_restarted", "not_adopted")
ADOPT_WITHIN = "30s"
# Seconds between a turn's end mark (written just before its command exits) and the history's
# exited_at beyond which its end is misdated: a supervisor's settling time is seconds later.
MISDATED = 1.0


def turn_command(lines: int, delay: float, starts: Path) -> list[str]:
    """The turn: its start mark, `lines` numbered lines `delay` s apart, its end mark (the
    time, epoch), exit 0."""
    return [
        "sh",
        "-c",
        f'echo "start $CCSUP_TURN" >> {starts}; i=0; while [ $i -lt {lines} ]; do '
        f'echo "$CCSUP_TURN $i"; i=$((i+1)); sleep {delay:.3f}; done; '
        f'echo "end $CCSUP_TURN $(date +%s.%N)" >> {starts}',
    ]


def turn_shape(rng: random.Random) -> tuple[int, float]:
    """Short and long turns: 0.2-3 s of lines every 20-50 ms."""
    delay = rng.uniform(0.02, 0.05)
    return max(1, round(rng.uniform(0.2, 3.0) / delay)), delay


# -- the supervisor ---------------------------------------------------------------------------------


class Supervisor:
    """`ccsup start --foreground` on the soak's state directory, SIGKILLed and started again."""

    def __init__(self, state_dir: Path, cap: int):
        self.state_dir = state_dir
        self.config = state_dir / "ccsup.toml"
        self.config.write_text(
            f"[slots]\ncaps = {{ {KEY} = {cap} }}\n\n"
            f'[guard]\ngrace = "300ms"\nscan = "200ms"\nadopt_within = "{ADOPT_WITHIN}"\n'
        )
        self.stderr_path = state_dir / "daemon.stderr"
        self.proc: subprocess.Popen | None = None
        self.pids: list[int] = []  # every supervisor started (their cgroups, for the caller)

    def client(self, timeout: float = 5.0):
        from supervisor.client import Client

        return Client(self.state_dir, timeout=timeout)

    def start(self, timeout: float = 90.0) -> dict:
        """Start it and wait for its `status` answer (after it adopted what waits); that answer."""
        from supervisor.errors import CcsupError

        command = [
            PYTHON,
            "-m",
            "supervisor",
            "--state-dir",
            str(self.state_dir),
            "--config",
            str(self.config),
            "start",
            "--foreground",
        ]
        with open(self.stderr_path, "ab") as err:
            self.proc = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=err, stderr=err, start_new_session=True
            )
        self.pids.append(self.proc.pid)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.stderr_path.read_text()[-2000:]
                raise RuntimeError(f"the supervisor exited {self.proc.returncode}: {tail}")
            try:
                with self.client(timeout=1.0) as client:
                    return client.status()
            except CcsupError:
                time.sleep(0.02)
        raise TimeoutError(f"the supervisor did not answer within {timeout} s")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        """`quit` (every turn ends), SIGKILL by pid if it does not."""
        from supervisor.errors import CcsupError

        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            with self.client() as client:
                client.quit()
            self.proc.wait(30)
        except (CcsupError, subprocess.TimeoutExpired):
            self.kill()


# -- a client process -------------------------------------------------------------------------------


def worker(state: Path, results: Path, n: int, seed: int, until: float, run: str) -> None:
    """Turns one at a time until `until` (epoch s), each written to worker-N.jsonl once ended."""
    from guardd import procs

    rng = random.Random(seed * 1000 + n)
    me = procs.identity_of(os.getpid())
    assert me is not None
    holder = {"pid": me.pid, "start": me.start, "session": f"w{n}"}
    out = open(results / f"worker-{n}.jsonl", "a", buffering=1)
    count = 0
    while time.time() < until:
        count += 1
        label = f"w{n}-{count}"
        lines, delay = turn_shape(rng)
        argv = turn_command(lines, delay, results / "starts")
        record: dict[str, Any] = {"label": label, "lines": lines}
        if rng.random() < 0.4:
            record.update(_by_cli(state, results, label, argv, run))
        else:
            record.update(_by_client(state, results, label, argv, run, {**holder, "agent": label}))
        out.write(json.dumps(record) + "\n")
    out.close()


def _by_client(
    state: Path, results: Path, label: str, argv: list[str], run: str, holder: dict
) -> dict:
    """Client.run_turn, its output reassembled (TurnOutput with fill) and kept in LABEL.out."""
    from supervisor.client import Client, TurnOutput
    from supervisor.errors import CcsupError

    got = b""
    while True:  # until the request is answered: a request is idempotent by its id
        acked = False
        try:
            with Client(state, timeout=3.0) as client:
                output = TurnOutput(label, fill=lambda s, a, b: client.read_log(label, s, a, b))
                terminal, exited = None, None
                for topic, body in client.run_turn(
                    KEY, argv, id=label, env={"SOAK_RUN": run}, holder=holder
                ):
                    acked = True
                    chunk = output.feed(topic, body)
                    if chunk is not None and chunk[0] == "stdout":
                        got += chunk[1]
                    kind = topic.rsplit(".", 1)[-1]
                    if kind == "exited":
                        exited = body
                    if kind in TERMINAL:
                        terminal = kind
                # what came after the last output event is in the log (as a sidecar drains it);
                # a turn that never ran has no log
                if (state / "turns" / label / "stdout.log").exists():
                    got += client.read_log(label, "stdout", output.position["stdout"])
            break
        except CcsupError as e:
            if acked:
                terminal, exited = f"error: {type(e).__name__}: {e}", None
                break
            time.sleep(0.1)
    (results / f"{label}.out").write_bytes(got)
    return {
        "mode": "client",
        "id": label,
        "acked": True,
        "terminal": terminal,
        "exited": _exit_of(exited),
    }


def _by_cli(state: Path, results: Path, label: str, argv: list[str], run: str) -> dict:
    """`ccsup run`; its stdout in LABEL.out, stderr in LABEL.err. Its turn id is found later by
    its holder's agent label in the history."""
    env = {**os.environ, "SOAK_RUN": run}
    env.pop("CCSUP_CONFIG", None)
    command = [PYTHON, "-m", "supervisor", "run", "--state-dir", str(state), "--key", KEY]
    command += ["--agent", label, "-q", "--", *argv]
    with open(results / f"{label}.out", "wb") as out, open(results / f"{label}.err", "wb") as err:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env)
        try:
            code = proc.wait(180)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
    return {"mode": "cli", "rc": code}


def _exit_of(exited: dict | None) -> dict | None:
    if exited is None:
        return None
    return {k: exited.get(k) for k in ("code", "signal", "reason")}


# -- the outside sampler ----------------------------------------------------------------------------


def sample(run: str, out: Path) -> None:
    """Every 10 ms until SIGTERM: which turns (CCSUP_TURN) have a live process among those with
    SOAK_RUN=run; the most at once, the number of samples and the longest time between two."""
    from guardd import procs

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    marker = f"SOAK_RUN={run}".encode()
    most, samples, longest, last = 0, 0, 0.0, time.monotonic()
    most_turns: list[str] = []
    while not stop.wait(0.01):
        live: set[str] = set()
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/environ", "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                continue
            if marker not in env:
                continue
            for var in env:
                if var.startswith(b"CCSUP_TURN="):
                    stat = procs.read_stat(int(name))
                    if stat is not None and not stat.zombie:
                        live.add(var[len(b"CCSUP_TURN=") :].decode())
        now = time.monotonic()
        longest, last = max(longest, now - last), now
        samples += 1
        if len(live) > most:
            most, most_turns = len(live), sorted(live)
    out.write_text(
        json.dumps(
            {
                "most": most,
                "most_turns": most_turns,
                "samples": samples,
                "longest_ms": round(longest * 1000, 1),
            }
        )
    )


# -- the driver -------------------------------------------------------------------------------------


class SlotWatch:
    """`ps` every 100 ms while a supervisor answers: a turn in two slots, or more held than cap."""

    def __init__(self, sup: Supervisor, cap: int):
        self.sup, self.cap = sup, cap
        self.looks = 0
        self.twice: list[str] = []
        self.over_cap = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from supervisor.errors import CcsupError

        while not self._stop.wait(0.1):
            try:
                with self.sup.client(timeout=1.0) as client:
                    slots = client.ps()["slots"]
            except CcsupError:
                continue
            self.looks += 1
            turns = [s["turn"] for s in slots if s.get("key") == KEY and s.get("turn")]
            self.twice += [t for t, n in Counter(turns).items() if n > 1]
            held = [s for s in slots if s.get("key") == KEY and s.get("state") != "free"]
            self.over_cap += len(held) > self.cap

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def run_soak(
    state_dir: Path,
    *,
    seconds: float,
    seed: int,
    cap: int = 2,
    workers: int = 4,
    burst: int = 6,
    say=lambda line: None,
) -> dict[str, Any]:
    """The soak on a fresh state directory; its counts. The supervisor is stopped at the end;
    Supervisor.pids (in counts["supervisor_pids"]) names every one started."""
    rng = random.Random(seed)
    results = state_dir / "soak"
    results.mkdir()
    starts = results / "starts"
    starts.touch()
    run = f"{os.getpid()}-{seed}"
    sup = Supervisor(state_dir, cap)
    sampler_out = results / "sampler.json"
    here = str(Path(__file__).resolve())
    sampler = subprocess.Popen([PYTHON, here, "sample", run, str(sampler_out)])
    procs: list[subprocess.Popen] = [sampler]
    watch: SlotWatch | None = None
    kills, gaps, adopted_at_start = 0, [], []
    bursts: list[dict] = []
    done = False
    try:
        sup.start()
        watch = SlotWatch(sup, cap)
        until = time.time() + seconds
        for n in range(workers):
            procs.append(
                subprocess.Popen(
                    [PYTHON, here, "worker", str(state_dir), str(results), str(n), str(seed)]
                    + [str(until), run]
                )
            )
        began = time.monotonic()
        burst_at = seconds * rng.uniform(0.2, 0.6)
        while time.time() < until:
            if not bursts and time.monotonic() - began > burst_at:
                bursts = _burst(sup, rng, burst, starts, run)  # killed right after the answers
            else:
                time.sleep(rng.uniform(0.0, 2.0))
            sup.kill()
            killed_at = time.monotonic()
            kills += 1
            time.sleep(rng.uniform(0.0, 1.5))
            status = sup.start()
            gaps.append(time.monotonic() - killed_at)
            adopted_at_start.append(status.get("adopted", 0))
            say(f"kill {kills}: gap {gaps[-1]:.2f} s, adopted {adopted_at_start[-1]}")
        for proc in procs[1:]:
            proc.wait(240)  # their last turns end, riding through the last restart
        quiet = _settle(sup)
        watch.stop()
        sampler.send_signal(signal.SIGTERM)
        sampler.wait(30)
        counts = _count(state_dir, results, bursts, cap, json.loads(sampler_out.read_text()))
        counts.update(
            seed=seed,
            seconds=seconds,
            cap=cap,
            workers=workers,
            kills=kills,
            longest_gap_s=round(max(gaps, default=0.0), 3),
            adopted_at_starts=sum(adopted_at_start),
            ps_looks=watch.looks,
            ps_turn_in_two_slots=len(watch.twice),
            ps_over_cap=watch.over_cap,
            quiet=quiet,
            supervisor_pids=sup.pids,
        )
        done = True
        return counts
    finally:
        if watch is not None:
            watch.stop()
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        sup.stop()
        if not done:  # interrupted: what the killed workers' `ccsup run` left, by pid
            for pid in _marked(run):
                os.kill(pid, signal.SIGKILL)


def _marked(run: str) -> list[int]:
    """The processes that carry this soak's SOAK_RUN marker."""
    marker, found = f"SOAK_RUN={run}".encode(), []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if name.isdigit() and marker in f.read().split(b"\0"):
                    found.append(int(name))
        except OSError:
            continue
    return found


def _burst(sup: Supervisor, rng: random.Random, n: int, starts: Path, run: str) -> list[dict]:
    """n turns asked at once (acknowledged: the answers came back); the caller kills at once."""
    from supervisor.errors import CcsupError

    asked = []
    with sup.client(timeout=5.0) as client:
        for i in range(n):
            lines, delay = turn_shape(rng)
            turn_id = f"b{os.getpid()}-{i}"
            try:
                client.turn(
                    KEY,
                    turn_command(lines, delay, starts),
                    id=turn_id,
                    env={"SOAK_RUN": run},
                    holder={"session": "burst"},
                )
            except CcsupError:
                continue
            asked.append({"id": turn_id, "lines": lines, "mode": "burst"})
    return asked


def _settle(sup: Supervisor, timeout: float = 120.0) -> bool:
    """Wait until no turn runs or waits; whether that happened."""
    from supervisor.errors import CcsupError

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with sup.client(timeout=2.0) as client:
                status = client.status()
            if not (status["turns"] or status["waits"]):
                return True
        except CcsupError:
            pass
        time.sleep(0.1)
    return False


def _history(state_dir: Path) -> tuple[dict[str, dict], list[tuple[str, str, dict]]]:
    """The history file's turns (id -> row) and lifecycle events (turn, kind, body)."""
    db = sqlite3.connect(f"file:{state_dir / 'history.sqlite'}?mode=ro", uri=True)
    db.row_factory = sqlite3.Row
    try:
        rows = {r["id"]: dict(r) for r in db.execute("SELECT * FROM turns")}
        events = [
            (r["turn_id"], r["kind"], json.loads(r["body"]))
            for r in db.execute("SELECT turn_id, kind, body FROM events")
        ]
    finally:
        db.close()
    for row in rows.values():
        row["holder"] = json.loads(row["holder"] or "{}")
    return rows, events


def _printed_id(results: Path, label: str) -> str | None:
    """The turn id a `ccsup run` printed first (for one whose queued event missed the history)."""
    try:
        with open(results / f"{label}.out", "rb") as f:
            first = f.readline().split()
    except FileNotFoundError:
        return None
    return first[0].decode() if len(first) == 2 else None


def _finished_log(state_dir: Path) -> dict[str, str]:
    """The supervisor's own list of finished ids (supervisor.turns.finished): id -> its end."""
    ended = {}
    try:
        text = (state_dir / "finished.log").read_text()
    except FileNotFoundError:
        return ended
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2:
            ended[parts[0]] = parts[1]
    return ended


def _log_lines(state_dir: Path, turn_id: str) -> bytes:
    try:
        return (state_dir / "turns" / turn_id / "stdout.log").read_bytes()
    except FileNotFoundError:
        return b""


def _bytes_wrong(turn_id: str, data: bytes, lines: int | None, complete: bool) -> tuple[int, int]:
    """(bytes lost, bytes repeated) of a turn's stdout against `<id> 0` ... `<id> lines-1`: a
    repeated or out-of-order line is repeated; a line missing before the last one seen (or, when
    the turn ended by itself, before `lines`) is lost."""
    seen: set[int] = set()
    repeated = 0
    last = -1
    for line in data.split(b"\n")[:-1] if data.endswith(b"\n") or not data else data.split(b"\n"):
        parts = line.split(b" ")
        if len(parts) != 2 or parts[0] != turn_id.encode() or not parts[1].isdigit():
            repeated += len(line) + 1  # not a line of it: counted as extra bytes
            continue
        i = int(parts[1])
        if i in seen or i < last:
            repeated += len(line) + 1
            continue
        seen.add(i)
        last = i
    end = lines if (complete and lines is not None) else last + 1
    lost = sum(len(f"{turn_id} {i}\n") for i in range(end) if i not in seen)
    return lost, repeated


def _count(
    state_dir: Path, results: Path, bursts: list[dict], cap: int, sampled: dict
) -> dict[str, Any]:
    rows, events = _history(state_dir)
    by_agent = {r["holder"].get("agent"): r["id"] for r in rows.values() if r["holder"]}
    asked: dict[str, dict] = {}  # turn id -> what the asker knows
    cli_codes: Counter[int] = Counter()  # of `ccsup run`s whose turn the history knows
    cli_refused: Counter[int] = Counter()  # of those that never asked (no supervisor answered)
    for path in sorted(results.glob("worker-*.jsonl")):
        for line in path.read_text().splitlines():
            item = json.loads(line)
            if item["mode"] == "cli":
                turn_id = by_agent.get(item["label"]) or _printed_id(results, item["label"])
                if turn_id is None:
                    cli_refused[item["rc"]] += 1
                    continue
                cli_codes[item["rc"]] += 1
                item["id"] = turn_id
            asked[item["id"]] = item
    for item in bursts:
        asked[item["id"]] = item
    marks = [line.split() for line in (results / "starts").read_text().splitlines()]
    starts = Counter(m[1] for m in marks if len(m) == 2 and m[0] == "start")
    end_marks = {m[1]: float(m[2]) for m in marks if len(m) == 3 and m[0] == "end"}
    granted = Counter((turn, body.get("epoch")) for turn, kind, body in events if kind == "granted")
    outcomes: Counter[str] = Counter()
    lost, cut_short, never_ran = [], [], []
    status_wrong: list[dict] = []  # a client told another status than the command's 0
    explained: list[dict] = []  # the same, for a turn whose end missed the history
    log_lost = log_repeated = client_lost = client_repeated = client_mismatch = 0
    finished = 0
    adopted = 0
    ended = _finished_log(state_dir)
    no_end_in_history = []
    misdated: list[dict] = []  # the history's exited_at more than MISDATED s from the end mark
    for turn_id, item in asked.items():
        row = rows.get(turn_id) or {}
        end_mark = end_marks.get(turn_id)
        if end_mark is not None and row.get("state") in TERMINAL:
            at = row.get("exited_at")
            if at is None or abs(at - end_mark) > MISDATED:
                misdated.append({"id": turn_id, "exited_at": at, "end_mark": end_mark})
        if row.get("state") not in TERMINAL:
            if turn_id not in ended:
                lost.append(turn_id)
                continue
            # finished (the supervisor's finished.log says so) but its end missed the history
            no_end_in_history.append(turn_id)
            row = {**row, "state": ended[turn_id], "outcome": f"{ended[turn_id]} (finished.log)"}
        finished += 1
        outcomes[row.get("outcome") or row["state"]] += 1
        adopted += row.get("adopted_at") is not None
        if row.get("outcome") in CUT_SHORT or row.get("reason") in CUT_SHORT:
            (cut_short if turn_id in starts else never_ran).append(turn_id)
        exited = item.get("exited") or {}
        complete = row.get("outcome") == "ok" or (exited.get("code") == 0 and not exited["reason"])
        complete = complete or item.get("rc") == 0
        log = _log_lines(state_dir, turn_id)
        lines = item.get("lines")
        if lines is not None and log == b"".join(f"{turn_id} {i}\n".encode() for i in range(lines)):
            # it ran to its end, so it exited 0: what its client says must be that
            said = item.get("rc") if item["mode"] == "cli" else item.get("exited")
            right = 0 if item["mode"] == "cli" else {"code": 0, "signal": None, "reason": None}
            if item["mode"] != "burst" and said != right:
                wrong = {"id": turn_id, "mode": item["mode"], "said": said}
                (explained if turn_id in no_end_in_history else status_wrong).append(wrong)
        a, b = _bytes_wrong(turn_id, log, lines, complete)
        log_lost, log_repeated = log_lost + a, log_repeated + b
        out_path = results / f"{item.get('label', turn_id)}.out"
        if item["mode"] != "burst" and out_path.exists():
            printed = out_path.read_bytes()
            a, b = _bytes_wrong(turn_id, printed, item.get("lines"), complete)
            client_lost, client_repeated = client_lost + a, client_repeated + b
            client_mismatch += complete and printed != log
    counts = {
        "turns_asked": len(asked),
        "turns_finished": finished,
        "turns_lost": len(lost),
        "lost_ids": lost[:10],
        "ends_missing_in_history": len(no_end_in_history),
        "ends_missing_ids": no_end_in_history[:10],
        "misdated_ends": len(misdated),
        "misdated": misdated[:10],
        "client_status_wrong": len(status_wrong),
        "status_wrong": status_wrong[:10],
        "client_status_wrong_end_missing": len(explained),
        "turns_started": len(starts),
        "turns_run_twice": sum(1 for n in starts.values() if n > 1),
        "grants_seen_twice": sum(1 for n in granted.values() if n > 1),
        "turns_adopted": adopted,
        "ended_by_restart": len(cut_short),
        "cut_short_ids": cut_short[:10],
        "granted_never_ran": len(never_ran),
        "never_ran_ids": never_ran[:10],
        "outcomes": dict(outcomes),
        "log_bytes_lost": log_lost,
        "log_bytes_repeated": log_repeated,
        "client_bytes_lost": client_lost,
        "client_bytes_repeated": client_repeated,
        "client_output_not_the_log": client_mismatch,
        "cli_exit_codes": {str(k): v for k, v in sorted(cli_codes.items())},
        "cli_refused_before_asking": {str(k): v for k, v in sorted(cli_refused.items())},
        "most_turns_at_once": sampled["most"],
        "most_turns": sampled["most_turns"],
        "samples": sampled["samples"],
        "longest_sample_gap_ms": sampled["longest_ms"],
    }
    return counts


def main(argv: list[str]) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    if argv[0] == "worker":
        state, results, n, seed, until, run = argv[1:7]
        worker(Path(state), Path(results), int(n), int(seed), float(until), run)
    elif argv[0] == "sample":
        sample(argv[1], Path(argv[2]))
    else:
        raise SystemExit(f"unknown mode {argv[0]!r}: worker or sample")


if __name__ == "__main__":
    main(sys.argv[1:])
