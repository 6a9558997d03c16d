"""The lifecycle of a training job: its states and the table of allowed transitions.

- the way through: QUEUED → PENDING → RUNNING → STORING → COMPLETED;
- restart after a learner failure within the restart budget: RUNNING → PENDING (a new numbered attempt, deployed
  from the last checkpoint);
- halt: PENDING or RUNNING → HALTING → HALTED (a queued job: QUEUED → HALTED); resume: HALTED → QUEUED;
- failure: QUEUED, PENDING, RUNNING, HALTING or STORING → FAILED.

Every transition not in :data:`TRANSITIONS` is refused by
:func:`check_transition`; a state never moves to itself (an update that changes nothing is not a transition).
"""

from __future__ import annotations

import enum

from labswarm.errors import Conflict


class JobState(enum.StrEnum):
    """The state of a training job (stored as its lower-case value)."""

    #: Set by the manager when the job is submitted, and again on resume: waits for learner slots.
    QUEUED = "queued"
    #: Set by the lifecycle manager when it has reserved the slots and deploys the learners (first attempt or a
    #: restart): no learner has reported yet.
    PENDING = "pending"
    #: Set by the lifecycle manager at the first heartbeat of the attempt's learners: training.
    RUNNING = "running"
    #: Set by the manager on a halt request (PATCH ``halt``): the learners are asked to checkpoint and exit; they
    #: are killed after the grace period.
    HALTING = "halting"
    #: Set by the lifecycle manager when the halted learners have exited (or a queued job was halted): holds no
    #: slot; keeps its checkpoint; resume moves it to QUEUED.
    HALTED = "halted"
    #: Set by the lifecycle manager when the learners have finished training (exit 0): the model, logs and
    #: metrics are being written to the results store.
    STORING = "storing"
    #: Set by the lifecycle manager when the results are stored. Terminal.
    COMPLETED = "completed"
    #: Set by the lifecycle manager when a fault is not retried (a user fault beyond the user budget, a platform
    #: fault beyond the platform budget) or the results cannot be stored. Terminal.
    FAILED = "failed"


#: The states a job never leaves: the slot is released and what the job owns beyond its results is collected.
TERMINAL: frozenset[JobState] = frozenset({JobState.COMPLETED, JobState.FAILED})

#: The states in which a job holds learner slots (counted against the lifecycle manager's capacity).
HOLDS_SLOTS: frozenset[JobState] = frozenset({JobState.PENDING, JobState.RUNNING, JobState.HALTING,
                                              JobState.STORING})

_S = JobState

#: ``old → {allowed new states}``; everything else is refused.
TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    _S.QUEUED: frozenset({
        _S.PENDING,    # slots reserved, learners being deployed
        _S.HALTED,     # halted before it ever ran: nothing to stop
        _S.FAILED,     # cannot start at all (its registered experiment was deleted, its stores are unreachable)
    }),
    _S.PENDING: frozenset({
        _S.RUNNING,    # the learners' first heartbeat
        _S.HALTING,    # halt requested while deploying
        _S.FAILED,     # the deploy failed beyond the platform budget
    }),
    _S.RUNNING: frozenset({
        _S.PENDING,    # a learner failed within the restart budget: a new attempt from the last checkpoint
        _S.HALTING,    # halt requested
        _S.STORING,    # training finished (every learner exited 0)
        _S.FAILED,     # a fault beyond its budget
    }),
    _S.HALTING: frozenset({
        _S.HALTED,     # the learners checkpointed and exited, or were killed after the grace period
        _S.STORING,    # the learners finished training before they saw the halt: the job completes
        _S.FAILED,     # the learners crashed while halting and no checkpoint is usable
    }),
    _S.HALTED: frozenset({
        _S.QUEUED,     # resume: a new attempt from the checkpoint, waiting for slots
    }),
    _S.STORING: frozenset({
        _S.COMPLETED,  # the model, logs and metrics are in the results store
        _S.FAILED,     # the results store refused them beyond the platform budget
    }),
    _S.COMPLETED: frozenset(),
    _S.FAILED: frozenset(),
}


class InvalidTransition(Conflict):
    """A job state change that :data:`TRANSITIONS` does not allow (HTTP 409, e.g. halting a completed job).

    Attributes:
        old: the job's current state.
        new: the refused state.
    """

    def __init__(self, old: JobState | str, new: JobState | str, reason: str | None = None) -> None:
        self.old = old
        self.new = new
        if reason is None:
            allowed = ", ".join(sorted(TRANSITIONS[JobState(old)])) or "none: it is terminal"
            reason = f"allowed: {allowed}"
        super().__init__(f"a {old} job cannot become {new} ({reason})")


def check_transition(old: JobState | str, new: JobState | str) -> JobState:
    """Check that a job may move from ``old`` to ``new``.

    Args:
        old: the current state (a :class:`JobState` or its value, as stored).
        new: the requested state.

    Returns:
        ``new`` as a :class:`JobState`.

    Raises:
        InvalidTransition: the table does not allow it (including ``old == new``), or either value is no state.
    """
    known = {state.value for state in JobState}
    if unknown := [str(v) for v in (old, new) if v not in known]:
        raise InvalidTransition(old, new, f"unknown state {unknown[0]!r}; the states are {sorted(known)}")
    old, new = JobState(old), JobState(new)
    if new not in TRANSITIONS[old]:
        raise InvalidTransition(old, new)
    return new
