"""The lifecycle of a session: its states and the table of allowed transitions.

- a session is created RUNNING (:meth:`SessionService.start_session`); pause: RUNNING → PAUSED; resume: PAUSED →
  RUNNING;
- the way out: RUNNING or PAUSED → COMPLETED (every sample has an outcome), CANCELLED (the user cancelled it) or
  FAILED (the session itself failed: its publisher crashed, its launcher could not start its workers, or its
  experiment became invalid while the manager was down).

Every transition not in :data:`TRANSITIONS` is refused by :func:`check_transition`, and a state never moves to
itself (an update that changes nothing is not a transition). The one place that writes a session's state is
:func:`labswarm.sessions.lifecycle.transition`. The states are stored (``sessions.status``) and shown by the REST
API as their lower-case values.
"""

from __future__ import annotations

import enum

from labswarm.errors import Conflict


class SessionState(enum.StrEnum):
    """The state of a session (stored as its lower-case value; equal to that string)."""

    #: Set by the manager when a session starts (the row is created in this state), and again on resume (POST
    #: ``/sessions/{id}/resume``): its publisher publishes, then reconciles, until every sample has an outcome.
    RUNNING = "running"
    #: Set by the manager on a pause request (POST ``/sessions/{id}/pause``): nothing more is published; the
    #: workers finish what is queued. Its publisher thread waits (and resumes after a manager restart, paused).
    PAUSED = "paused"
    #: Set by the session's publisher thread when reconciliation finds no sample without an outcome. Terminal.
    COMPLETED = "completed"
    #: Set by the manager on a cancel request (POST ``/sessions/{id}/cancel``): its publisher stops, its queue is
    #: purged, the workers the manager runs for it are stopped. Terminal.
    CANCELLED = "cancelled"
    #: Set by the publisher thread when it crashed, or by the manager when the session's launcher could not start
    #: its workers or, at a manager start, its experiment is invalid or its publisher cannot be made (``error``
    #: says why). Terminal.
    FAILED = "failed"


#: The states in which a session's publisher thread runs (or waits, paused): at most one per experiment.
ACTIVE: tuple[SessionState, ...] = (SessionState.RUNNING, SessionState.PAUSED)

#: The states a session never leaves (its ``finished_at`` is stamped on the way in).
TERMINAL: frozenset[SessionState] = frozenset({SessionState.COMPLETED, SessionState.CANCELLED,
                                               SessionState.FAILED})

_S = SessionState

#: ``old → {allowed new states}``; everything else is refused.
TRANSITIONS: dict[SessionState, frozenset[SessionState]] = {
    _S.RUNNING: frozenset({
        _S.PAUSED,      # pause requested
        _S.COMPLETED,   # every sample has an outcome (done, cached or failed)
        _S.CANCELLED,   # cancel requested
        _S.FAILED,      # the publisher crashed, the launcher failed, or the experiment is invalid at a restart
    }),
    _S.PAUSED: frozenset({
        _S.RUNNING,     # resume requested
        _S.COMPLETED,   # the reconciler found no pending sample just as the pause came
        _S.CANCELLED,   # cancel requested
        _S.FAILED,      # as from RUNNING
    }),
    _S.COMPLETED: frozenset(),
    _S.CANCELLED: frozenset(),
    _S.FAILED: frozenset(),
}


class InvalidTransition(Conflict):
    """A session state change that :data:`TRANSITIONS` does not allow (HTTP 409).

    Attributes:
        old: the session's current state.
        new: the refused state.
    """

    def __init__(self, old: SessionState | str, new: SessionState | str, reason: str | None = None) -> None:
        self.old = old
        self.new = new
        if reason is None:
            allowed = ", ".join(sorted(TRANSITIONS[SessionState(old)])) or "none: it is terminal"
            reason = f"allowed: {allowed}"
        super().__init__(f"a {old} session cannot become {new} ({reason})")


def check_transition(old: SessionState | str, new: SessionState | str) -> SessionState:
    """Check that a session may move from ``old`` to ``new``.

    Args:
        old: the current state (a :class:`SessionState` or its value, as stored).
        new: the requested state.

    Returns:
        ``new`` as a :class:`SessionState`.

    Raises:
        InvalidTransition: the table does not allow it (including ``old == new``), or either value is no state.
    """
    known = {state.value for state in SessionState}
    if unknown := [str(v) for v in (old, new) if v not in known]:
        raise InvalidTransition(old, new, f"unknown state {unknown[0]!r}; the states are {sorted(known)}")
    old, new = SessionState(old), SessionState(new)
    if new not in TRANSITIONS[old]:
        raise InvalidTransition(old, new)
    return new
