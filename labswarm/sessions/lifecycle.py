"""The one write point of a session's state: every change of ``sessions.status`` after the row is created goes
through :func:`transition`, which checks it against :data:`labswarm.sessions.states.TRANSITIONS`.
"""

from __future__ import annotations

from labswarm.db import utcnow
from labswarm.sessions.models import SessionRow
from labswarm.sessions.states import ACTIVE, TERMINAL, InvalidTransition, SessionState, check_transition


def transition(row: SessionRow, new: SessionState, *, error: str | None = None) -> SessionState:
    """Move session ``row`` to ``new``, checked against the transition table; the caller commits.

    Entering a terminal state stamps ``finished_at``; ``error``, when given, is recorded as the session's reason
    (a failed session's).

    Args:
        row: the session, as read in the caller's database session.
        new: the state to move to.
        error: why the session ended (kept in ``row.error``).

    Returns:
        ``new`` as a :class:`~labswarm.sessions.states.SessionState`.

    Raises:
        InvalidTransition: the table does not allow it (e.g. a cancelled session resumed, or a state set to itself);
            the row is left as it was.
    """
    new = check_transition(row.status, new)
    row.status = new.value
    if new in TERMINAL:
        row.finished_at = utcnow()
    if error is not None:
        row.error = error
    return new


def end(row: SessionRow, new: SessionState, *, error: str | None = None) -> bool:
    """End session ``row`` with the terminal state ``new`` (through :func:`transition`), unless it has ended
    already: then its end stays as it was.

    Args:
        row: the session, as read in the caller's database session (the caller commits).
        new: a terminal state.
        error: why the session ended (kept in ``row.error``).

    Returns:
        Whether the session was active and has now ended with ``new``.

    Raises:
        InvalidTransition: ``new`` is not a terminal state.
    """
    if new not in TERMINAL:
        raise InvalidTransition(row.status, new, "not a terminal state")
    if row.status not in ACTIVE:
        return False
    transition(row, new, error=error)
    return True
