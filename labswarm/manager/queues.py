"""The manager's part in RabbitMQ hygiene (issue 28): it runs the :class:`~labswarm.queue.cleanup.QueueCleaner`
over its sessions' table, which knows when each experiment's last session ended (see :mod:`labswarm.queue.cleanup`
for what is deleted, when, and why no message is lost)."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import case, func, select

from labswarm.queue.cleanup import QueueCleaner
from labswarm.queue.names import is_embedded
from labswarm.sessions.models import SessionRow
from labswarm.sessions.service import SessionService
from labswarm.sessions.states import ACTIVE


def ended_experiments(service: SessionService) -> dict[str, float]:
    """``{experiment: Unix time in s when its last session ended}`` for the experiments that have sessions and
    none running or paused (a session ended without ``finished_at``, if any: its creation time)."""
    active = func.sum(case((SessionRow.status.in_([s.value for s in ACTIVE]), 1), else_=0))
    last = func.max(func.coalesce(SessionRow.finished_at, SessionRow.created_at))
    query = select(SessionRow.experiment, last).group_by(SessionRow.experiment).having(active == 0)
    with service.db() as db:
        return {name: _unix(moment) for name, moment in db.execute(query) if moment is not None}


def queue_cleaner(service: SessionService) -> QueueCleaner | None:
    """A started cleaner of the service's broker, or ``None`` where there is none to run (the embedded broker, or
    ``queue_delete_after`` unset or 0)."""
    delay = service.settings.queue_delete_after
    url, celery = getattr(service.broker, "url", None), getattr(service.broker, "celery", None)
    if not delay or not isinstance(url, str) or celery is None or is_embedded(url):
        return None  # (a test's stand-in broker has neither)
    cleaner = QueueCleaner(celery, lambda: ended_experiments(service), delay)
    cleaner.start()
    return cleaner


def _unix(moment: datetime | str) -> float:
    """A stored (naive UTC) time in Unix seconds (SQLite's aggregate comes back as text)."""
    if isinstance(moment, str):
        moment = datetime.fromisoformat(moment)
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()
