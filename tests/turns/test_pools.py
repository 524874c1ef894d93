"""Account pools in a running supervisor: a pool's turns run on its members with each member's
[env] (CODEX_HOME), wait in the pool's one queue, go to the other member while one is paused,
count against a member asked for directly, and at size never put more than a member's cap of
work on it (a sampler outside the supervisor watches the work itself)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from conftest import wait_until


def pools_config(tmp: Path, members: dict[str, int], name: str = "codex") -> tuple[str, str]:
    """(caps, extra) for the daemon fixture: the pool `name` of `members`, each with a
    CODEX_HOME directory of its own under tmp."""
    caps = ", ".join(f'"{m}" = {cap}' for m, cap in members.items())
    names = ", ".join(f'"{m}"' for m in members)
    extra = f"\n[pools]\n{name} = [{names}]\n"
    for m in members:
        home = tmp / m.replace(":", "-")
        home.mkdir()
        extra += f'[env."{m}"]\nCODEX_HOME = "{home}"\nACCOUNT_TOKEN = "secret-of-{m}"\n'
    return caps, extra


def hold_until(path: Path, before: str = "") -> list[str]:
    return ["sh", "-c", f'{before}while [ ! -e "{path}" ]; do sleep 0.02; done']


def stdout_of(log, turn_id: str) -> str:
    return "".join(b.get("data", "") for b in log.find(f"turn.{turn_id}.stdout"))


def ccsup(state_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "supervisor", "--state-dir", str(state_dir), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_two_members_run_a_turn_each_with_their_codex_home_and_a_third_takes_the_first_freed(
    daemon, event_log, state_dir, tmp_path
):
    caps, extra = pools_config(tmp_path, {"codex:work": 1, "codex:home": 1})
    d = daemon(caps=caps, extra=extra)
    log = event_log(d)
    go = {i: tmp_path / f"go{i}" for i in range(3)}
    with d.client() as client:
        for i in range(3):
            show = 'echo "$CODEX_HOME"; '
            answer = client.turn("codex", hold_until(go[i], show), id=f"p{i}", env={"MINE": "x"})
            assert (answer["state"] == "queued") == (i == 2), answer
        assert log.wait_for("turn.p0.granted")["member"] == "codex:work"
        assert log.wait_for("turn.p1.granted")["member"] == "codex:home"
        wait_until(lambda: stdout_of(log, "p0") and stdout_of(log, "p1"), timeout=15)
        assert stdout_of(log, "p0") == f"{tmp_path / 'codex-work'}\n"
        assert stdout_of(log, "p1") == f"{tmp_path / 'codex-home'}\n"
        ps = client.ps()
        rows = {s["turn"]: (s["key"], s.get("pool"), s.get("member")) for s in ps["slots"]}
        assert rows == {
            "p0": ("codex:work", "codex", "codex:work"),
            "p1": ("codex:home", "codex", "codex:home"),
        }
        assert [(w["id"], w["key"], w["why"]["reason"]) for w in ps["waits"]] == [
            ("p2", "codex", "key_full")
        ]
        text = ccsup(state_dir, "ps").stdout
        assert "codex:work (codex)" in text and "codex:home (codex)" in text
        go[1].touch()  # the second member frees first: the third takes it
        assert log.wait_for("turn.p2.granted")["member"] == "codex:home"
        wait_until(lambda: stdout_of(log, "p2"), timeout=15)
        assert stdout_of(log, "p2") == f"{tmp_path / 'codex-home'}\n"
        go[0].touch()
        go[2].touch()
        for i in range(3):
            log.wait_for(f"turn.p{i}.released")
    # the member is in the history and `show`; the member's env is nowhere on file or the bus
    wait_until(lambda: '"member": "codex:home"' in ccsup(state_dir, "show", "p2", "--json").stdout)
    shown = ccsup(state_dir, "show", "p2").stdout
    assert "  member     codex:home" in shown and "  slot       codex:home#0" in shown
    history = json.loads(ccsup(state_dir, "history", "--json").stdout)
    assert {r["id"]: r["member"] for r in history} == {
        "p0": "codex:work",
        "p1": "codex:home",
        "p2": "codex:home",
    }
    everything = json.dumps([(t, b) for t, b, _ in log.events])
    for root, _, files in os.walk(state_dir):
        for name in files:
            path = Path(root) / name
            if path.suffix in (".json", ".log", ".journal", ".sqlite", ".db") or "history" in name:
                everything += path.read_bytes().decode("utf-8", "replace")
    assert "secret-of-" not in everything


def test_with_one_member_paused_every_turn_goes_to_the_other_and_a_direct_turn_counts(
    daemon, event_log, state_dir, tmp_path
):
    caps, extra = pools_config(tmp_path, {"codex:work": 1, "codex:home": 1})
    d = daemon(caps=caps, extra=extra)
    log = event_log(d)
    paused = ccsup(state_dir, "pause", "codex:work", "--for", "60s", "--reason", "test")
    assert paused.returncode == 0, paused.stderr
    with d.client() as client:
        for i in range(4):
            client.turn("codex", ["true"], id=f"q{i}")
        for i in range(4):
            assert log.wait_for(f"turn.q{i}.granted")["member"] == "codex:home"
            log.wait_for(f"turn.q{i}.released")
        assert ccsup(state_dir, "resume", "codex:work").returncode == 0
        # a member asked directly takes its slot: the pool's turn goes to the other member
        go = tmp_path / "go"
        client.turn("codex:work", hold_until(go), id="direct")
        log.wait_for("turn.direct.started")
        client.turn("codex", hold_until(go), id="pooled")
        assert log.wait_for("turn.pooled.granted")["member"] == "codex:home"
        client.turn("codex", ["true"], id="third")
        wait_until(lambda: [w["id"] for w in client.ps()["waits"]] == ["third"], timeout=10)
        go.touch()
        assert log.wait_for("turn.third.granted")["member"] in ("codex:work", "codex:home")
        for name in ("direct", "pooled", "third"):
            log.wait_for(f"turn.{name}.released")


class Sampler:
    """Outside the supervisor: how many turns' work is in each member's CODEX_HOME at once (each
    turn makes a file there while it runs), sampled as fast as the directories can be listed."""

    def __init__(self, homes: list[Path]):
        self.homes = homes
        self.most = {home.name: 0 for home in homes}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for home in self.homes:
                count = len(os.listdir(home))
                self.most[home.name] = max(self.most[home.name], count)
            self.samples += 1
            time.sleep(0.001)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def test_a_hundred_pool_turns_over_three_members_keep_each_cap_and_their_order(
    daemon, event_log, tmp_path
):
    members = {"codex:a": 1, "codex:b": 2, "codex:c": 1}
    caps, extra = pools_config(tmp_path, members)
    d = daemon(caps=caps, extra=extra)
    log = event_log(d, prefixes=("turn.",))
    homes = [tmp_path / m.replace(":", "-") for m in members]
    sampler = Sampler(homes)
    work = 'touch "$CODEX_HOME/$ID"; sleep 0.05; rm "$CODEX_HOME/$ID"'
    ids = [f"n{i:03d}" for i in range(100)]
    try:
        with d.client() as client:
            for turn_id in ids:
                client.turn("codex", ["sh", "-c", work], id=turn_id, env={"ID": turn_id})
            for turn_id in ids:
                log.wait_for(f"turn.{turn_id}.released", timeout=120)
    finally:
        sampler.stop()
    granted = [t.split(".")[1] for t in log.topics("turn.") if t.endswith(".granted")]
    assert granted == ids  # FIFO: granted in the order asked
    on = {turn_id: log.find(f"turn.{turn_id}.granted")[0]["member"] for turn_id in ids}
    assert set(on.values()) == set(members)  # every member worked
    assert sampler.samples > 100
    assert sampler.most == {home.name: members[home.name.replace("-", ":")] for home in homes}
    codes = [log.find(f"turn.{turn_id}.exited")[0]["code"] for turn_id in ids]
    assert codes == [0] * 100


def test_after_a_crash_running_pool_turns_are_adopted_on_their_members_and_a_waiter_keeps_its_place(
    daemon, event_log, state_dir, tmp_path
):
    import signal

    caps, extra = pools_config(tmp_path, {"codex:work": 1, "codex:home": 1})
    d = daemon(caps=caps, extra=extra, adopt_within="30s")
    go = {i: tmp_path / f"go{i}" for i in range(4)}
    log = event_log(d)
    with d.client() as client:
        for i in range(4):
            client.turn("codex", hold_until(go[i]), id=f"r{i}")
        log.wait_for("turn.r0.started")
        log.wait_for("turn.r1.started")
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait()
    d.start()
    log = event_log(d)
    with d.client() as client:
        assert client.status()["adopted"] == 2
        ps = client.ps()
        rows = {s["turn"]: (s["key"], s.get("pool"), s.get("member")) for s in ps["slots"]}
        assert rows == {
            "r0": ("codex:work", "codex", "codex:work"),
            "r1": ("codex:home", "codex", "codex:home"),
        }
        assert [(w["id"], w["key"], w["position"]) for w in ps["waits"]] == [
            ("r2", "codex", 1),
            ("r3", "codex", 2),
        ]
        go[0].touch()
        assert log.wait_for("turn.r2.granted")["member"] == "codex:work"
        log.wait_for("turn.r0.released")
        assert log.find("turn.r3.granted") == []
        for i in (1, 2, 3):
            go[i].touch()
        assert log.wait_for("turn.r3.granted")["member"] in ("codex:work", "codex:home")
        for i in (1, 2, 3):
            log.wait_for(f"turn.r{i}.released")


def test_with_one_member_held_for_quota_every_turn_goes_to_the_other(
    daemon, event_log, state_dir, tmp_path
):
    caps, extra = pools_config(tmp_path, {"codex:work": 1, "codex:home": 1})
    d = daemon(caps=caps, extra=extra)
    log = event_log(d)
    held = ccsup(state_dir, "quota", "set", "codex:work", "--window", "5h", "--used", "0.97")
    assert held.returncode == 2  # (--resets-at is required)
    args = ("quota", "set", "codex:work", "--window", "5h", "--used", "0.97", "--resets-at", "+2h")
    held = ccsup(state_dir, *args)
    assert held.returncode == 0, held.stderr
    go = tmp_path / "go"
    with d.client() as client:
        client.turn("codex", hold_until(go), id="first")
        assert log.wait_for("turn.first.granted")["member"] == "codex:home"
        client.turn("codex", ["true"], id="second")  # waits for home: work has no quota room
        wait_until(lambda: [w["id"] for w in client.ps()["waits"]] == ["second"], timeout=10)
        why = client.ps()["waits"][0]["why"]
        assert why["reason"] == "key_full" and "codex:work: quota" in why["detail"], why
        go.touch()
        assert log.wait_for("turn.second.granted")["member"] == "codex:home"
        for i in range(3):
            client.turn("codex", ["true"], id=f"more{i}")
            assert log.wait_for(f"turn.more{i}.granted")["member"] == "codex:home"
        assert ccsup(state_dir, "quota", "clear", "codex:work").returncode == 0
        client.turn("codex", hold_until(go.with_name("never")), id="after")
        assert log.wait_for("turn.after.granted")["member"] == "codex:work"
        client.cancel("after")
        for name in ("first", "second", "more0", "more1", "more2", "after"):
            log.wait_for(f"turn.{name}.released")


def test_start_refuses_caps_for_a_pools_name_and_changes_nothing(state_dir, tmp_path):
    config = tmp_path / "pools.toml"
    caps, extra = pools_config(tmp_path, {"codex:work": 1})
    config.write_text(f"[slots]\ncaps = {{ {caps} }}\n{extra}")
    started = ccsup(state_dir, "start", "--config", str(config), "--caps", "codex=2")
    assert started.returncode == 2, started
    assert f"--caps codex: codex is a pool ([pools] in {config})" in started.stderr
    assert not (state_dir / "supervisor.lock").exists()


def test_status_lists_the_pool_and_no_cap_for_its_name_and_pause_knows_it(
    daemon, event_log, state_dir, tmp_path
):
    caps, extra = pools_config(tmp_path, {"codex:work": 1, "codex:home": 1}, "accounts")
    d = daemon(caps=caps, extra=extra)
    log = event_log(d)
    with d.client() as client:
        client.pause("codex:work", for_=60)
        client.pause("codex:home", for_=60)
        client.turn("accounts", ["true"], id="waits")  # the pool's name is now a waiting key
        status = client.status()
        assert status["pools"] == {"accounts": ["codex:work", "codex:home"]}
        assert "accounts" not in {e["key"] for e in status["caps_in_force"]}
        text = ccsup(state_dir, "status").stdout
        assert "pool    accounts = codex:work, codex:home" in text
        paused = ccsup(state_dir, "pause", "accounts", "--for", "30s")  # no --force asked
        assert paused.returncode == 0, paused.stderr
        client.resume("codex:work")
        client.resume("codex:home")
        assert client.ps()["waits"][0]["why"]["reason"] == "paused"  # the pool's own pause
        client.resume("accounts")
        assert log.wait_for("turn.waits.granted")["member"] == "codex:work"
        log.wait_for("turn.waits.released")
