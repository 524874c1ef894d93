"""Reservations: a slot held for an agent about to start, bound by its turn or released in time."""

from __future__ import annotations

import time

import pytest
from conftest import wait_until

from supervisor.client import RemoteError

HOLDER = {"session": "s1", "agent": "a1"}


def slot_states(client, key="codex") -> list[str]:
    return [s["state"] for s in client.ps()["slots"] if s["key"] == key]


def test_a_held_reservation_is_bound_by_its_turn_without_waiting(daemon, event_log):
    d = daemon(caps="codex = 1", extra='reservation_ttl = "30s"')
    log = event_log(d)
    with d.client() as client:
        before = time.time()
        answer = client.reserve("codex", holder=HOLDER, id="r1")
        assert (
            answer["reservation"] == "r1"
            and answer["state"] == "held"
            and answer["position"] is None
        )
        assert before + 29 < answer["until"] <= time.time() + 30
        assert slot_states(client) == ["reserved"]
        client.turn("codex", ["true"], id="other")  # waits: the only slot is reserved
        # Bound without waiting: it holds the slot at once (granted: its guard is being started
        # through the zygote, whose answer comes on the event loop after this reply).
        bound = client.turn("codex", ["sleep", "0.2"], id="t1", holder=HOLDER, reservation="r1")
        assert (bound["state"], bound["position"]) == ("granted", None)
        released = log.wait_for("turn.r1.released")
        assert released["reason"] == "bound" and released["turn"] == "t1"
        log.wait_for("turn.t1.released")
        log.wait_for("turn.other.released")
    topics = log.topics("turn.")
    assert topics.index("turn.t1.started") < topics.index("turn.other.granted")


def test_an_unbound_reservation_is_released_in_time_and_the_next_waiter_gets_the_slot(
    daemon, event_log
):
    d = daemon(caps="codex = 1", extra='reservation_ttl = "400ms"')
    log = event_log(d)
    with d.client() as client:
        client.reserve("codex", holder=HOLDER, id="r1")
        client.turn("codex", ["true"], id="next")
        assert log.wait_for("turn.r1.released")["reason"] == "expired"
        log.wait_for("turn.next.released")


def test_asking_again_returns_the_same_reservation_and_never_extends_it(daemon):
    d = daemon(caps="codex = 2", extra='reservation_ttl = "30s"')
    with d.client() as client:
        first = client.reserve("codex", holder=HOLDER, id="r1")
        time.sleep(0.05)
        again = client.reserve("codex", holder=HOLDER, id="r2")
        assert again == first
        assert client.reserve("codex", holder=HOLDER, id="r1") == first
        other = client.reserve("codex", holder={"session": "s1", "agent": "a2"}, id="r3")
        assert other["reservation"] == "r3"
        assert sorted(slot_states(client)) == ["reserved", "reserved"]


def test_a_reservation_cancelled_while_waiting_takes_nothing(daemon, event_log):
    d = daemon(caps="codex = 1")
    log = event_log(d)
    with d.client() as client:
        client.turn("codex", ["sleep", "300"], id="busy")
        assert client.reserve("codex", holder=HOLDER, id="r1")["state"] == "queued"
        assert client.cancel("r1")["state"] == "cancelled"
        client.cancel("busy")
        log.wait_for("turn.busy.released")
        assert slot_states(client) == []  # nothing taken
        assert log.topics("turn.r1.") == ["turn.r1.queued", "turn.r1.cancelled"]


def test_a_turn_naming_a_waiting_reservation_takes_its_place(daemon, event_log):
    d = daemon(caps="codex = 1")
    log = event_log(d)
    with d.client() as client:
        client.turn("codex", ["sleep", "300"], id="busy")
        client.reserve("codex", holder=HOLDER, id="r1")  # position 1
        client.turn("codex", ["true"], id="later")  # position 2
        answer = client.turn("codex", ["true"], id="t1", holder=HOLDER, reservation="r1")
        assert answer == {"id": "t1", "state": "queued", "position": 1}
        assert log.wait_for("turn.r1.cancelled")["reason"] == "bound"
        client.cancel("busy")
        log.wait_for("turn.later.released")
    granted = [t for t in log.topics("turn.") if t.endswith(".granted")]
    assert granted == ["turn.busy.granted", "turn.t1.granted", "turn.later.granted"]


def test_a_bound_reservation_is_never_taken_back_when_its_time_runs_out(
    daemon, event_log, state_dir
):
    d = daemon(caps="codex = 1", extra='reservation_ttl = "300ms"')
    log = event_log(d)
    with d.client() as client:
        until = client.reserve("codex", holder=HOLDER, id="r1")["until"]
        client.turn("codex", ["sleep", "300"], id="t1", holder=HOLDER, reservation="r1")
        client.turn("codex", ["true"], id="next")
        wait_until(lambda: time.time() > until + 0.1, what="the reservation's end to pass")
        assert [s["turn"] for s in client.ps()["slots"]] == ["t1"]  # the turn still holds the slot
        # t1 runs until cancelled (a short sleep could end before the check on a loaded machine).
        client.cancel("t1")
        log.wait_for("turn.next.released")
    topics = log.topics("turn.")
    assert topics.index("turn.t1.released") < topics.index("turn.next.granted")
    assert log.find("turn.r1.released")[0]["reason"] == "bound"


def test_binding_someone_elses_reservation_is_refused(daemon):
    d = daemon(caps="codex = 1")
    with d.client() as client:
        client.reserve("codex", holder=HOLDER, id="r1")
        with pytest.raises(RemoteError) as err:
            client.turn(
                "codex",
                ["true"],
                id="t1",
                holder={"session": "s2", "agent": "a1"},
                reservation="r1",
            )
        assert err.value.code == "conflict"
        with pytest.raises(RemoteError) as err:
            client.turn("claude", ["true"], id="t2", holder=HOLDER, reservation="r1")
        assert err.value.code == "conflict"
        assert slot_states(client) == ["reserved"]


def test_a_reservation_requested_on_the_bus_is_answered_by_its_events(daemon):
    d = daemon(caps="codex = 1")
    with d.client() as client:
        sub = client.publish_request("reserve", {"id": "r9", "key": "codex", "holder": HOLDER})
        topics = [sub.recv(5)[0], sub.recv(5)[0]]
        sub.close()
        assert topics == ["turn.r9.queued", "turn.r9.granted"]
        assert slot_states(client) == ["reserved"]
