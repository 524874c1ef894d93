"""What is in force, said plainly: `status` lists each key's cap with its
source, the rates and max_pause; `pause` of an unknown key is refused unless --force; a pause cut
by max_pause says so; `reload` prints what changed; `cancel` of a finished turn says it had
already finished. Real supervisors, started by `ccsup start`."""

from __future__ import annotations

import json

from cli_daemon import ccsup, cli_daemon_fixture  # noqa: F401 (the cli_daemon fixture)

CONFIG = """\
[slots]
caps = { t = 2 }
rates = { t = "50/1m" }
max_pause = "1m"

[harness.h]
default_cap = 3
"""


def test_status_lists_each_caps_source_the_rates_and_max_pause(cli_daemon):
    state_dir = cli_daemon(CONFIG, "--caps", "x=4")
    ran = ccsup("run", "--key", "h:v", "--", "true", state_dir=state_dir)
    assert ran.returncode == 0, ran.stderr
    status = ccsup("status", state_dir=state_dir)
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    for line in (
        "cap     h:v = 3 (harness default: harness.h.default_cap)",
        "cap     t = 2 (config)",
        "cap     x = 4 (--caps)",
        "cap     any other key = 1 (default_cap)",
        "rate    t = 50/60s",
        "pauses  at most 1m00s ([slots] max_pause)",
    ):
        assert line in lines, status.stdout
    as_json = json.loads(ccsup("status", "--json", state_dir=state_dir).stdout)
    assert {e["key"]: e["source"] for e in as_json["caps_in_force"]} == {
        "h:v": "harness default",
        "t": "config",
        "x": "--caps",
    }


def test_pause_of_an_unknown_key_is_refused_unless_forced(cli_daemon):
    state_dir = cli_daemon(CONFIG)
    typo = ccsup("pause", "tt", "--for", "30s", state_dir=state_dir)
    assert typo.returncode == 2, typo.stderr
    assert typo.stderr.startswith("ccsup: tt is not a configured key and has never run here")
    assert "--force" in typo.stderr
    keys = json.loads(ccsup("status", "--json", state_dir=state_dir).stdout)["keys"]
    assert [k for k in keys if k.get("paused")] == []  # nothing was paused

    forced = ccsup("pause", "tt", "--for", "30s", "--force", state_dir=state_dir)
    assert forced.returncode == 0, forced.stderr
    assert "warning: tt is not a configured key" in forced.stderr
    assert forced.stdout.startswith("tt paused until ")
    known = ccsup("pause", "t", "--for", "30s", state_dir=state_dir)
    assert (known.returncode, known.stderr) == (0, "")
    harness = ccsup("pause", "h", "--for", "30s", state_dir=state_dir)  # [harness.h]
    assert (harness.returncode, harness.stderr) == (0, "")


def test_a_pause_cut_by_max_pause_says_so(cli_daemon):
    state_dir = cli_daemon(CONFIG)
    long = ccsup("pause", "t", "--for", "2h", state_dir=state_dir)
    assert long.returncode == 0, long.stderr
    first, note = long.stdout.splitlines()
    assert first.startswith("t paused until ")
    assert note.startswith("note: you asked until ")
    assert "no pause may last longer than [slots] max_pause (1m00s)" in note
    short = ccsup("pause", "t", "--for", "10s", state_dir=state_dir)
    assert len(short.stdout.splitlines()) == 1, short.stdout


def test_reload_prints_what_changed(cli_daemon):
    state_dir = cli_daemon(CONFIG)
    config = state_dir / "ccsup.toml"
    config.write_text(
        config.read_text().replace("t = 2", "t = 3").replace('"50/1m"', '"5/10s"')
        + '\n[pause_on.t]\nexit_codes = [75]\nfor = "20s"\n'
    )
    reloaded = ccsup("reload", state_dir=state_dir)
    assert reloaded.returncode == 0, reloaded.stderr
    assert reloaded.stdout.splitlines() == [
        f"reloaded {config}: 4 changes",
        "  pause_on.t.exit_codes: (not set) -> 75",
        "  pause_on.t.for: (not set) -> 20s",
        "  slots.caps.t: 2 -> 3",
        "  slots.rates.t: 50/60s -> 5/10s",
    ]
    again = ccsup("reload", state_dir=state_dir)
    assert again.stdout == f"reloaded {config}: nothing changed\n"


def test_cancel_of_a_finished_turn_says_it_had_finished_and_exits_0(cli_daemon):
    state_dir = cli_daemon(CONFIG)
    ran = ccsup("run", "--key", "t", "--json", "--", "sh", "-c", "exit 3", state_dir=state_dir)
    assert ran.returncode == 3
    turn_id = json.loads(ran.stdout.splitlines()[0])["topic"].split(".")[1]
    cancelled = ccsup("cancel", turn_id, state_dir=state_dir)
    assert (cancelled.returncode, cancelled.stderr) == (0, "")
    assert cancelled.stdout == (
        f"turn {turn_id} had already finished (exit 3, released); nothing to cancel\n"
    )
