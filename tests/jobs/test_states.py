"""Job states: the transition table is complete and closed, and everything outside it is refused."""

from __future__ import annotations

import itertools

import pytest

from labswarm.errors import Conflict, LabswarmError
from labswarm.jobs import HOLDS_SLOTS, TERMINAL, TRANSITIONS, InvalidTransition, JobState, check_transition

S = JobState
ALLOWED = sorted((old, new) for old, targets in TRANSITIONS.items() for new in targets)
REFUSED = sorted(pair for pair in itertools.product(S, S) if pair[1] not in TRANSITIONS[pair[0]])


def test_the_states_issue_12_names() -> None:
    assert {s.name for s in S} == {"QUEUED", "PENDING", "RUNNING", "HALTING", "HALTED", "STORING", "COMPLETED",
                                   "FAILED"}
    assert all(s.value == s.name.lower() for s in S)


def test_the_table_covers_every_state_and_only_states() -> None:
    assert set(TRANSITIONS) == set(S)
    assert all(isinstance(new, JobState) for targets in TRANSITIONS.values() for new in targets)


def test_terminal_states_are_exactly_those_without_exits() -> None:
    assert {s for s, targets in TRANSITIONS.items() if not targets} == TERMINAL == {S.COMPLETED, S.FAILED}
    assert not TERMINAL & HOLDS_SLOTS
    assert S.QUEUED not in HOLDS_SLOTS and S.HALTED not in HOLDS_SLOTS


def _reachable(start: JobState) -> set[JobState]:
    seen, todo = {start}, [start]
    while todo:
        for new in TRANSITIONS[todo.pop()]:
            if new not in seen:
                seen.add(new)
                todo.append(new)
    return seen


def test_every_state_is_reachable_from_queued_and_can_end() -> None:
    assert _reachable(S.QUEUED) == set(S)
    for state in S:
        assert _reachable(state) & TERMINAL, f"{state} can never end"


@pytest.mark.parametrize(("old", "new"), ALLOWED)
def test_allowed_transitions_pass(old: JobState, new: JobState) -> None:
    assert check_transition(old, new) is new
    assert check_transition(old.value, new.value) is new  # as stored in the database


@pytest.mark.parametrize(("old", "new"), REFUSED)
def test_every_other_transition_is_refused(old: JobState, new: JobState) -> None:
    with pytest.raises(InvalidTransition) as caught:
        check_transition(old, new)
    assert (caught.value.old, caught.value.new) == (old, new)
    assert f"a {old} job cannot become {new}" in str(caught.value)
    assert isinstance(caught.value, Conflict) and isinstance(caught.value, LabswarmError)


def test_no_state_moves_to_itself() -> None:
    assert all((s, s) in REFUSED for s in S)


@pytest.mark.parametrize("path", [
    [S.QUEUED, S.PENDING, S.RUNNING, S.STORING, S.COMPLETED],                               # the way through
    [S.QUEUED, S.PENDING, S.RUNNING, S.PENDING, S.RUNNING, S.STORING, S.COMPLETED],         # a restart
    [S.QUEUED, S.PENDING, S.RUNNING, S.HALTING, S.HALTED, S.QUEUED, S.PENDING, S.RUNNING],  # halt, resume
    [S.QUEUED, S.HALTED, S.QUEUED],                                                         # halt while queued
    [S.QUEUED, S.PENDING, S.RUNNING, S.FAILED],                                             # beyond the budget
])
def test_the_lifecycles_of_issue_12_are_allowed(path: list[JobState]) -> None:
    for old, new in itertools.pairwise(path):
        assert new in TRANSITIONS[old], f"the table lacks {old} -> {new}"
        assert check_transition(old, new) is new, f"{old} -> {new}"
        assert check_transition(old.value, new.value) is new, f"{old.value!r} -> {new.value!r}"


#: The lifecycle of issue 12 as its module docstring states it, written out here rather than read from the table,
#: so that an edge added to or dropped from :data:`TRANSITIONS` fails a test instead of being accepted by the ones
#: above (which take the table as given).
DOCUMENTED = {
    S.QUEUED: {S.PENDING, S.HALTED, S.FAILED},
    S.PENDING: {S.RUNNING, S.HALTING, S.FAILED},
    S.RUNNING: {S.PENDING, S.HALTING, S.STORING, S.FAILED},
    S.HALTING: {S.HALTED, S.STORING, S.FAILED},
    S.HALTED: {S.QUEUED},
    S.STORING: {S.COMPLETED, S.FAILED},
    S.COMPLETED: set(),
    S.FAILED: set(),
}


def test_the_table_is_the_documented_lifecycle() -> None:
    assert {old: set(targets) for old, targets in TRANSITIONS.items()} == DOCUMENTED


@pytest.mark.parametrize(("old", "new"), list(itertools.product(S, S)))
def test_check_transition_answers_every_pair_as_documented(old: JobState, new: JobState) -> None:
    if new in DOCUMENTED[old]:
        assert check_transition(old, new) is new
    else:
        with pytest.raises(InvalidTransition):
            check_transition(old, new)


@pytest.mark.parametrize(("old", "new"), [(S.COMPLETED, S.QUEUED), (S.FAILED, S.RUNNING), (S.HALTED, S.RUNNING),
                                          (S.QUEUED, S.RUNNING), (S.STORING, S.HALTING)])
def test_the_refusals_that_matter(old: JobState, new: JobState) -> None:
    with pytest.raises(InvalidTransition):
        check_transition(old, new)


def test_a_terminal_refusal_says_it_is_terminal() -> None:
    with pytest.raises(InvalidTransition, match="none: it is terminal"):
        check_transition("completed", "queued")


@pytest.mark.parametrize(("old", "new"), [("running", "paused"), ("RUNNING", "halted"), (None, "queued")])
def test_unknown_states_are_refused(old: object, new: str) -> None:
    with pytest.raises(InvalidTransition, match="unknown state"):
        check_transition(old, new)  # type: ignore[arg-type]
