"""What the dashboard's pages show, read from the manager's services (nothing here changes anything).

Each function returns plain data for a template; the live parts of the pages then follow the APIs' event streams
(``/sessions/{id}/events``, ``/v1/jobs/{id}/events``) from the browser.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select

from labswarm.sessions.models import ACTIVE, SessionRow
from labswarm.sessions.service import SessionService
from labswarm.ui.seen import learners_seen, session_workers

#: Sessions and jobs listed on the overview (the newest).
RECENT = 20
#: Metric keys shown as a job's "last metrics", in this order, when present.
METRIC_KEYS = ("epoch", "train_loss", "train_accuracy", "val_loss", "val_accuracy")


def _counts(sessions: SessionService, column, owner_column, owner: str | None) -> dict[str, int]:
    """Rows per status of ``column``'s table (one ``GROUP BY``), only ``owner``'s rows when given."""
    stmt = select(column, func.count()).group_by(column)
    if owner is not None:
        stmt = stmt.where(owner_column == owner)
    with sessions.db() as db:
        return {status: int(n) for status, n in db.execute(stmt)}


def owner_filter(user: Any) -> str | None:
    """The owner filter of a caller (:class:`~labswarm.auth.tokens.User`): ``None`` (everything) for an admin,
    else the user's name, so a user's pages show their own experiments, sessions and jobs only (as the API does)."""
    return None if user is not None and user.is_admin else getattr(user, "name", "")


def overview(sessions: SessionService, jobs: Any | None, owner: str | None = None) -> dict[str, Any]:
    """The overview page's data.

    Args:
        sessions: the session service.
        jobs: the training-jobs service (:class:`~labswarm.jobs.service.service.JobService`), ``None`` when the manager
            hosts none.
        owner: only this user's experiments, sessions and jobs (and totals); ``None``: everyone's (an admin).

    Returns:
        ``experiments`` (rows, each with its ``active`` session id or ``None``), ``sessions`` (the
        :data:`RECENT` newest, as :meth:`SessionService.progress` shows them), ``jobs`` (the newest, each with its
        ``last_metrics``: the :data:`METRIC_KEYS` of its last metrics record), and ``totals``: sessions and jobs
        per status, and over the active sessions the samples done, failed, waiting (queue depth: published, no
        outcome yet) and done per second; ``seen``: per active session its ``workers`` (its launcher's) and
        ``consumers`` (the broker's; ``None``: unknown, e.g. the embedded broker) (:mod:`labswarm.ui.seen`), and
        ``learners``: the running jobs' learners with their last heartbeat; totals ``workers``, ``consumers``
        (the sum of the counts known; ``None`` when active sessions have none known), ``workers_unknown`` and
        ``consumers_unknown`` (active sessions whose count is not known: workers started by someone else, the
        embedded broker), and ``learners_seen``. ``done_per_s`` sums the active sessions' samples done per second
        since their start.
    """
    recent = [sessions.progress(row.id) for row in sessions.sessions(limit=RECENT, owner=owner)]
    active = {p["experiment"]: p["id"] for p in recent if p["status"] in ACTIVE}
    for row in sessions.sessions(status=list(ACTIVE), limit=1_000, owner=owner):
        active.setdefault(row.experiment, row.id)
    experiments = [{"name": row.name, "fingerprint": row.fingerprint, "updated_at": row.updated_at,
                    "active": active.get(row.name)} for row in sessions.registry.list(owner)]
    running = [sessions.progress(sid) for sid in active.values()]
    seen = [{**p, **session_workers(sessions, p)} for p in running]
    known = [s["consumers"] for s in seen if s["consumers"] is not None]
    workers = [s["workers"] for s in seen if s["workers"] is not None]
    totals: dict[str, Any] = {
        "experiments": len(experiments), "sessions": _counts(sessions, SessionRow.status, SessionRow.owner, owner),
        "active_sessions": len(running), "done": sum(p["done"] + p["cached"] for p in running),
        "failed": sum(p["failed"] for p in running), "depth": sum(p["pending"] for p in running),
        "done_per_s": sum(p["samples_per_s"] for p in running), "jobs": {}, "learners": 0,
        "workers": sum(workers) if workers or not seen else None, "workers_unknown": len(seen) - len(workers),
        "consumers": sum(known) if known or not seen else None, "consumers_unknown": len(seen) - len(known),
        "learners_seen": 0,
    }
    learners: list[dict[str, Any]] = []
    listed: list[dict[str, Any]] = []
    if jobs is not None:
        from labswarm.jobs.records.models import JobRow
        from labswarm.jobs.spec.states import HOLDS_SLOTS

        listed = jobs.list(limit=RECENT, owner=owner)["jobs"]
        for job in listed:
            records = jobs.metrics(job["id"])
            last = records[-1] if records else {}
            job["last_metrics"] = {key: last[key] for key in METRIC_KEYS if key in last}
        totals["jobs"] = _counts(sessions, JobRow.status, JobRow.owner, owner)
        asked = (select(func.coalesce(func.sum(JobRow.learners), 0))
                 .where(JobRow.status.in_([s.value for s in HOLDS_SLOTS])))
        if owner is not None:
            asked = asked.where(JobRow.owner == owner)
        with sessions.db() as db:
            totals["learners"] = int(db.scalar(asked) or 0)
        learners = learners_seen(sessions, (), owner)
        totals["learners_seen"] = len(learners)
    return {"experiments": experiments, "sessions": recent, "jobs": listed, "totals": totals, "seen": seen,
            "learners": learners}


def session_page(sessions: SessionService, session_id: str, owner: str | None = None) -> dict[str, Any]:
    """The session page's data: its progress, its first page of failures (the page follows the stream), and its
    workers and consumers seen (``seen``).

    Raises:
        NotFound: no such session, or (``owner`` given) another user's.
    """
    sessions.session(session_id, owner)
    progress = sessions.progress(session_id)
    return {"session": progress, "failures": sessions.failures(session_id, limit=100),
            "seen": session_workers(sessions, progress)}


def session_seen(sessions: SessionService, session_id: str, owner: str | None = None) -> dict[str, Any]:
    """A session's ``workers`` and ``consumers`` (:func:`labswarm.ui.seen.session_workers`), for the session
    page to refresh.

    Raises:
        NotFound: no such session, or (``owner`` given) another user's.
    """
    sessions.session(session_id, owner)
    return session_workers(sessions, sessions.progress(session_id))


def job_page(jobs: Any, job_id: str, owner: str | None = None) -> dict[str, Any]:
    """The job page's data: the job as ``GET /v1/jobs/{id}`` shows it (the page follows its event stream).

    Raises:
        NotFound: no such job, or (``owner`` given) another user's.
    """
    return {"job": jobs.describe(job_id, owner)}
