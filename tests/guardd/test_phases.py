"""The guard's phases as one table (guardd.guard.CHANGES, s6's `actions[state][event]`): every
phase is reached from running and reaches gone, gone is final, a change the table lacks is refused
(GuardFailure, the guard's exit 125), and nothing but `Guard._change` changes the phase."""

from __future__ import annotations

import ast
import inspect

import pytest

from guardd import guard
from guardd.guard import (
    ALL_GONE,
    CHANGES,
    GONE,
    GRACE_OVER,
    KILLING,
    RUNNING,
    START_FAILED,
    STOP,
    TERMINATING,
    Guard,
    GuardFailure,
    Phase,
    next_phase,
)

EVENTS = (STOP, GRACE_OVER, ALL_GONE, START_FAILED)


def moves(phase: Phase) -> set[Phase]:
    """Where one event may take `phase`."""
    found = set()
    for event in EVENTS:
        try:
            found.add(next_phase(phase, event))
        except GuardFailure:
            pass
    return found


def reached_from(start: Phase) -> set[Phase]:
    reached, todo = {start}, [start]
    while todo:
        for phase in moves(todo.pop()) - reached:
            reached.add(phase)
            todo.append(phase)
    return reached


def test_every_phase_is_reached_from_running_and_reaches_gone_which_is_final():
    assert reached_from(RUNNING) == set(Phase)
    assert all(GONE in reached_from(phase) for phase in Phase)
    assert moves(GONE) == set()
    assert {event for _, event in CHANGES} == set(EVENTS)  # no event the guard never sends


def test_the_stop_runs_terminating_killing_gone_and_each_may_end_at_once():
    path = [RUNNING]
    for event in (STOP, GRACE_OVER, ALL_GONE):
        path.append(next_phase(path[-1], event))
    assert path == [RUNNING, TERMINATING, KILLING, GONE]
    for phase in (RUNNING, TERMINATING, KILLING):
        assert next_phase(phase, ALL_GONE) is GONE
    assert next_phase(RUNNING, START_FAILED) is GONE


@pytest.mark.parametrize(
    "phase, event",
    [
        (RUNNING, GRACE_OVER),  # no grace runs before a stop
        (TERMINATING, STOP),  # a second stop is not a change (_begin_stop keeps the first)
        (KILLING, GRACE_OVER),
        (TERMINATING, START_FAILED),
        (GONE, ALL_GONE),
        (GONE, STOP),
    ],
)
def test_a_change_the_table_lacks_is_refused(phase, event):
    with pytest.raises(GuardFailure, match=f"unable to change phase {phase.value} on {event}"):
        next_phase(phase, event)
    g = Guard.__new__(Guard)  # the guard's own method, without starting anything
    g.phase = phase
    with pytest.raises(GuardFailure):
        g._change(event)
    assert g.phase is phase  # refused: nothing changed


def test_only_change_assigns_the_phase():
    """Every change goes through the table: no other method of Guard writes `self.phase`."""
    (cls,) = [
        node
        for node in ast.parse(inspect.getsource(guard)).body
        if isinstance(node, ast.ClassDef) and node.name == "Guard"
    ]
    writers = set()
    for method in cls.body:
        for node in ast.walk(method):
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, (ast.AugAssign, ast.AnnAssign))
                else []
            )
            for target in targets:
                if isinstance(target, ast.Attribute) and target.attr == "phase":
                    writers.add(getattr(method, "name", "?"))
    assert writers == {"__init__", "_change"}


def test_a_phase_hashes_and_compares_as_a_str():
    """What `_record_state`'s docstring says: a StrEnum member runs no enum code when hashed or
    compared (str's own slots, in C)."""
    assert Phase.__hash__ is str.__hash__
    assert Phase.__eq__ is str.__eq__
    assert {"running": 1}[RUNNING] == 1
