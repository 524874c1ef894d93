"""The machine's room (supervisor.admission.room): predictions, the budget's arithmetic, order,
"runs alone", and the pressure brake read from a PSI file the test writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.admission.policy import WaitReason
from supervisor.admission.room import MachineRoom, p90, read_psi
from supervisor.config.memory import MemorySettings
from supervisor.holder import Holder
from supervisor.turns.states import Reservation, Turn

GIB = 1 << 30


def turn(turn_id: str, key: str = "mem", at: float = 0.0) -> Turn:
    return Turn(turn_id, key, ["true"], None, {}, Holder(), requested_at=at)


def room(tmp_path: Path, avg10: float | None = 0.0, **settings) -> tuple[MachineRoom, list]:
    psi = tmp_path / "memory"
    if avg10 is not None:
        write_psi(psi, avg10)
    published: list = []
    made = MachineRoom(
        MemorySettings(**settings),
        publish=lambda topic, body: published.append((topic, body)),
        psi_file=str(psi),
        meminfo=lambda: {"MemTotal": 8 * GIB, "MemAvailable": 4 * GIB},
    )
    return made, published


def write_psi(path: Path, avg10: float) -> None:
    path.write_text(
        f"some avg10={avg10:.2f} avg60=0.00 avg300=0.00 total=1\n"
        "full avg10=0.00 avg60=0.00 avg300=0.00 total=1\n"
    )


def run(r: MachineRoom, t: Turn) -> None:
    """As the ledger's `granted` event does."""
    r.running[t.id] = t.key


def test_p90_is_the_nearest_rank_of_the_last_peaks():
    assert p90([]) is None
    assert p90([5]) == 5
    assert p90([1, 3, 2]) == 3  # ceil(2.7) = 3rd smallest
    assert p90(list(range(1, 21))) == 18
    assert p90([100] * 19 + [1]) == 100


def test_a_prediction_is_learned_else_the_estimate_else_none(tmp_path):
    r, _ = room(tmp_path, budget=3 * GIB, estimate={"mem": GIB, "codex": 2 * GIB})
    assert r.prediction("mem") == (GIB, "estimate")
    assert r.prediction("codex:work") == (2 * GIB, "estimate")  # the bare harness's
    assert r.prediction("other") == (None, None)
    r._observe("turn.t1.exited", {"key": "mem", "peak_mem": 3 * GIB // 2})
    assert r.prediction("mem") == (3 * GIB // 2, "learned")
    r.load({"mem": [GIB] * 30})  # at start: the last 20 of the history
    assert len(r.peaks["mem"]) == 20 and r.prediction("mem") == (GIB, "learned")
    for _ in range(20):
        r.learn("mem", 2 * GIB)
    assert r.prediction("mem") == (2 * GIB, "learned")  # the oldest are forgotten


def test_a_size_budget_counts_each_running_turn_at_the_larger_of_prediction_and_use(tmp_path):
    r, _ = room(tmp_path, budget=3 * GIB, estimate={"mem": GIB * 12 // 10})
    a, b, c = turn("a", at=1), turn("b", at=2), turn("c", at=3)
    assert r.hold(a, 0) is None
    run(r, a)
    assert r.hold(b, 0) is None
    run(r, b)
    why = r.hold(c, 0)
    assert why is not None and why.reason is WaitReason.MEMORY
    assert why.detail.startswith("needs 1.20GiB (estimate peak of mem); room 614MiB of budget")
    r.finished("b")
    assert r.hold(c, 0) is None
    r.using["a"] = 2 * GIB  # a uses more than predicted: it counts what it uses
    assert r.hold(c, 0) is not None
    assert r.predicted_use() == 2 * GIB


def test_a_key_without_a_figure_and_a_reservation_are_admitted_by_their_caps_alone(tmp_path):
    r, _ = room(tmp_path, budget=GIB, estimate={"mem": GIB})
    run(r, turn("a"))
    assert r.hold(turn("b", key="other"), 0) is None
    assert r.hold(Reservation("r", "mem", Holder()), 0) is None
    assert r.hold(turn("c"), 0) is not None


def test_auto_is_memavailable_less_reserve_less_what_running_turns_may_still_grow(tmp_path):
    r, _ = room(tmp_path, budget="auto", reserve=GIB, estimate={"mem": 2 * GIB})
    run(r, turn("a"))
    r.using["a"] = GIB // 2  # may grow 1.5 GiB more: room 4 - 1 - 1.5 = 1.5 GiB
    assert r.room() == (3 * GIB // 2, 7 * GIB)
    assert r.hold(turn("b", at=1), 0) is not None
    r.using["a"] = 2 * GIB  # at its prediction: room 3 GiB
    assert r.hold(turn("b", at=1), 0) is None


def test_a_head_that_can_never_fit_runs_alone_and_says_so(tmp_path):
    r, _ = room(tmp_path, budget=3 * GIB, estimate={"mem": GIB, "big": 4 * GIB})
    run(r, turn("a"))
    why = r.hold(turn("huge", key="big", at=1), 0)
    assert why is not None and why.reason is WaitReason.MEMORY
    assert "more than the whole budget 3.00GiB: it runs alone" in why.detail
    # Younger heads that need room wait behind it, so it is not starved ...
    behind = r.hold(turn("small", at=2), 0)
    assert behind is not None and "behind turn huge of key big" in behind.detail
    # ... a key with no figure is not held by it.
    assert r.hold(turn("free", key="other", at=3), 0) is None
    r.finished("a")
    assert r.hold(turn("huge", key="big", at=1), 0) is None
    assert r.alone == "huge"


def test_the_pressure_brake_holds_everything_and_publishes_its_start_and_end(tmp_path):
    r, published = room(tmp_path, avg10=12.5)
    why = r.hold(Reservation("r", "any", Holder()), 0)
    assert why is not None and why.reason is WaitReason.PRESSURE
    assert "12.50% is at or above 10%" in why.detail
    assert published == [("supervisor.pressure", {"on": True, "avg10": 0.125})]
    write_psi(tmp_path / "memory", 9.99)
    r._psi_at = float("-inf")  # next read now (else at most every REFRESH)
    assert r.hold(turn("a"), 0) is None
    assert published[-1] == ("supervisor.pressure", {"on": False, "avg10": pytest.approx(0.0999)})


def test_no_psi_turns_the_brake_off_and_status_says_so(tmp_path):
    r, published = room(tmp_path, avg10=None)
    assert r.hold(turn("a"), 0) is None and published == []
    assert r.view()["off"] == [f"pressure brake: no PSI ({tmp_path / 'memory'} missing)"]
    assert read_psi(str(tmp_path / "missing")) is None
    assert read_psi("/proc/pressure/memory") is None or 0 <= read_psi("/proc/pressure/memory") <= 1
