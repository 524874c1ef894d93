"""The epoch tells a restart from a gap: a subscription fed events by hand
(no sockets) counts a hole in `seq` or a turn's `turn_seq` within one supervisor run as lost, and
the first event of a new run (a new epoch, every count from 1 again) as nothing lost."""

from __future__ import annotations

from supervisor.client.subscription import Loss, Subscription
from supervisor.wire import protocol


class NoSocket:
    """Subscription only sets options on its socket before it is read."""

    def setsockopt(self, option, value) -> None:
        pass


def event(topic: str, epoch: str, seq: int, **counters) -> list[bytes]:
    return protocol.encode_event(topic, {"id": "t"}, seq=seq, counters=counters, epoch=epoch)


def fed(prefixes: list[str], *messages: list[bytes]) -> tuple[Subscription, list]:
    losses: list = []
    sub = Subscription(
        NoSocket(),  # type: ignore[arg-type]
        prefixes,
        on_gap=lambda first, last: losses.append(("seq", first, last)),
        on_loss=losses.append,
    )
    for frames in messages:
        sub._accept(frames)
    return sub, losses


def test_a_jump_in_seq_within_one_epoch_is_a_gap_and_a_new_epoch_is_not():
    slot = "slot.k.taken"
    sub, losses = fed([""], event(slot, "aa", 7), event(slot, "aa", 9), event(slot, "bb", 4))
    assert losses == [("seq", 8, 9)] and sub.gaps == 1 and sub.epoch == "bb"  # on_gap: (8, 9)
    sub, losses = fed([""], event(slot, "aa", 7), event(slot, "bb", 9))
    assert losses == [] and sub.gaps == 0  # events 1..8 of run bb were before we got there


def test_a_followed_turn_counts_again_from_its_first_event_of_a_new_epoch():
    turn = "turn.t.stdout"
    sub, losses = fed(
        ["turn.t."],
        event(turn, "aa", 1, turn_seq=1),
        event(turn, "aa", 2, turn_seq=2),
        event(turn, "bb", 30, turn_seq=5),  # adopted, and its first output were missed: a restart
        event(turn, "bb", 31, turn_seq=6),
        event(turn, "bb", 40, turn_seq=9),  # within run bb: 7 and 8 were lost
    )
    assert losses == [Loss("turn_seq", "t", 7, 8)]


def test_a_lost_end_after_a_restart_is_inferred_without_a_loss():
    sub, losses = fed(
        ["turn.t."],
        event("turn.t.started", "aa", 3, turn_seq=3),
        event("supervisor.started", "bb", 1, supervisor_seq=1),
    )
    sub._accept(
        protocol.encode_event(
            protocol.TURN_ENDED,
            {"id": "t", "key": "k", "state": "released", "turn_seq": 4},
            seq=2,
            counters={"supervisor_seq": 2},
            epoch="bb",
        )
    )
    assert losses == [] and sub._pending[-1] == (
        "turn.t.released",
        {"id": "t", "key": "k", "inferred": True},
    )


def test_an_epoch_outside_the_supervisors_own_families_is_not_believed():
    sub, losses = fed([""], event("turn.t.queued", "aa", 7), event("fuzz.x", "zz", 9))
    assert sub.epoch == "aa" and losses == [("seq", 8, 9)]
