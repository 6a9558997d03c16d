"""A batch of worker outcomes applied to a session's ledger: the hot path of every worker's reports."""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy.orm import Session

from labswarm.sessions import ledger
from labswarm.sessions.runner import SessionRunner

log = logging.getLogger(__name__)


def record_outcomes(db: Session, runner: SessionRunner | None, session_id: str, outcomes: list[dict[str, Any]],
                    owner: str | None = None) -> tuple[int, list[dict[str, str]]]:
    """Apply a batch of worker outcomes to the ledger, for the samples of this session only, and commit.

    A sample of the session is one in its ledger, or one its publisher has sent and not yet written there
    (read from the runner BEFORE the ledger: the runner writes the ledger, then forgets). Any other sample
    id (another session's, or unknown) is rejected, never recorded; the rest of the batch is.

    The session's existence and ``owner`` are checked in the same transaction as the write (one database
    session for the whole request).

    Args:
        db: a database session (committed here).
        runner: the session's publisher in this process, or ``None`` (the session is not publishing here).
        session_id: the session.
        outcomes: ``{sample_id, status, reason?, seconds?}`` each.
        owner: when given, the session must be this user's.

    Returns:
        ``(applied, rejected)``: how many were recorded, and ``{sample_id, reason}`` for each one rejected.

    Raises:
        NotFound: no such session, or (``owner`` given) another user's; nothing is recorded.
    """
    in_flight = runner.in_flight([o["sample_id"] for o in outcomes]) if runner is not None else set()
    n, unknown = ledger.record_outcomes(db, session_id, outcomes, in_flight, owner)
    db.commit()
    if runner is not None and n:
        refused = set(unknown)
        timed = [float(o["seconds"]) for o in outcomes
                 if o["sample_id"] not in refused and o.get("seconds") is not None]
        runner.note_outcomes(max(timed, default=0.0), n, sum(timed), len(timed))
    if unknown:
        log.warning("session %s: %d outcomes rejected (not samples of the session), e.g. %r", session_id,
                    len(unknown), unknown[0][:200])
    reason = f"not a sample of session {session_id}"
    return n, [{"sample_id": sample_id, "reason": reason} for sample_id in unknown]
