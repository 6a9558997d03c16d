"""The sessions' HTTP routes: experiments, sessions, and what workers report (mounted by the manager).

The routes are module-level (:data:`router`); each gets the session service from the app
(``app.state.sessions``, :func:`get_service`) and its caller (:func:`labswarm.auth.authenticator.current_user`),
as dependencies; the app's own dependency authenticates every route. Creating routes record the caller as
the owner; reads and controls see only the caller's experiments and sessions (an admin's: everyone's), and answer
404 for another user's, as for one that does not exist. Workers authenticate as the admin.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, Field

from labswarm.auth.authenticator import current_user
from labswarm.auth.limits import MAX_OFFSET
from labswarm.auth.tokens import User
from labswarm.errors import ConfigError, Conflict
from labswarm.queue.app import queue_name
from labswarm.redact import has_password, redact_url
from labswarm.sessions.models import ExperimentRow
from labswarm.sessions.service import MAX_FAILURES_PAGE, MAX_SESSIONS_PAGE, SESSIONS_PAGE, SessionService

#: A session status, as a filter of ``GET /sessions``: the values of
#: :class:`~labswarm.sessions.states.SessionState` (a test checks they agree), as a ``Literal`` so that the OpenAPI
#: schema lists them inline, as it always did.
SessionStatus = Literal["running", "paused", "completed", "cancelled", "failed"]


async def get_service(request: Request) -> SessionService:
    """Route dependency: the session service the app hosts (``request.app.state.sessions``)."""
    return request.app.state.sessions


#: The caller of a route (the app-wide authentication ran first).
Caller = Annotated[User, Depends(current_user)]
#: The session service, from the app.
Service = Annotated[SessionService, Depends(get_service)]

#: The routes of the session service (mounted by the manager; authenticated by the app's dependency).
router = APIRouter()


def scope(user: User) -> str | None:
    """The owner filter of ``user``'s reads and controls: ``None`` for an admin (everything), else their name."""
    return None if user.is_admin else user.name


class RateBody(BaseModel):
    """A publish rate in tasks/s."""

    rate: float = Field(gt=0, le=100_000)


class WeightBody(BaseModel):
    """A session's weight: its share of the workers it shares with other sessions, relative to theirs."""

    weight: float = Field(gt=0, le=1_000)


class SessionBody(BaseModel):
    """Options of a new session."""

    rate: float | None = Field(None, gt=0, le=100_000)
    weight: float = Field(1.0, gt=0, le=1_000, description="share of the workers relative to other sessions")
    launcher: Literal["none", "local", "swarm"] = Field(
        "none", description="who runs the workers: none (someone else), local (processes on the manager's machine "
        "that it supervises and stops), swarm (a docker swarm service the manager creates and removes)")
    workers: int = Field(0, ge=0, le=10_000, description="workers the launcher starts")
    follow: bool = Field(False, description="follow the labels CSV: rows appended later are published as they "
                         "appear; the session ends only when cancelled")


class WorkersBody(BaseModel):
    """The number of workers of a session whose launcher the manager runs."""

    workers: int = Field(ge=0, le=10_000)


class Outcome(BaseModel):
    """One sample's outcome, as a worker reports it."""

    sample_id: str
    status: str = Field(pattern="^(computed|done|cached|failed)$")
    reason: str | None = None
    seconds: float | None = None
    finished_at: float | None = Field(None, description="when the worker finished the sample, Unix time in s")


class OutcomesBody(BaseModel):
    """A batch of outcomes of one session."""

    outcomes: list[Outcome]


class RedeliveryBody(BaseModel):
    """A sample whose message the broker delivered again."""

    sample_id: str


@router.get("/settings")
def worker_settings(service: Service) -> dict[str, Any]:
    """What a worker needs besides the experiment: the report interval, the queue bound, and the broker URL
    only when it carries no password (the embedded broker); otherwise ``broker_url`` is ``null`` and
    ``broker`` shows it with the password masked: workers read it from their own ``LABSWARM_BROKER_URL``."""
    url = service.broker.url
    settings = service.settings
    return {"broker_url": None if has_password(url) else url, "broker": redact_url(url),
            "report_interval": settings.report_interval, "max_queue_length": settings.max_queue_length,
            "samples_per_message": settings.samples_per_message or 1}  # what the queue bound is computed with


@router.post("/experiments", status_code=201)
async def post_experiment(request: Request, user: Caller, service: Service) -> dict[str, Any]:
    """Register an experiment from YAML (``Content-Type: application/yaml``) or JSON; the caller owns it.

    422 lists each invalid field with its path and the reason. Names are global (they name queues): 409
    when the name is another user's (an admin may replace it; its owner stays).
    """
    body = (await request.body()).decode("utf-8", errors="replace")
    if "json" in request.headers.get("content-type", ""):
        try:
            data: Any = json.loads(body)
        except ValueError as exc:
            raise ConfigError([("", f"invalid JSON: {exc}")]) from None
    else:
        data = body
    row = service.registry.register(data, user.name, admin=user.is_admin)
    return _experiment(row, service.registry.problem(row.name, row))


@router.get("/experiments")
def list_experiments(user: Caller, service: Service) -> list[dict[str, Any]]:
    """The caller's registered experiments (an admin's: all): name, owner, fingerprint, queue, times, and
    ``valid``: false with the ``problem`` when the stored configuration no longer validates or names a path
    outside the data roots."""
    return [_experiment(row, service.registry.problem(row.name, row))
            for row in service.registry.list(scope(user))]


@router.get("/experiments/{name}")
def get_experiment(name: str, user: Caller, service: Service) -> dict[str, Any]:
    """One experiment with its stored configuration (and ``valid``, ``problem``)."""
    row = service.registry.get(name, scope(user))
    return _experiment(row, service.registry.problem(row.name, row), with_config=True)


@router.get("/experiments/{name}/config")
def get_config(name: str, user: Caller, service: Service) -> dict[str, Any]:
    """The validated configuration; what a worker fetches once when it starts. 409 for an invalid one."""
    row = service.registry.get(name, scope(user))
    if (problem := service.registry.problem(row.name, row)) is not None:
        raise Conflict(problem)
    return row.config


@router.post("/experiments/{name}/sessions", status_code=201)
def start_session(name: str, user: Caller, service: Service, body: SessionBody | None = None) -> dict[str, Any]:
    """Start a session: publish every sample of the experiment to its queue (with ``follow``, and every sample
    of the rows appended to its labels CSV later, until cancelled). The caller owns the session; unless an
    admin, the experiment must be theirs. Workers asked of a launcher count against the caller's ``workers``
    quota (429 past it, before anything starts)."""
    if body is not None and body.launcher != "none":
        service.launchers.admit(user.name, body.workers)
    row = service.start_session(name, body.rate if body else None, weight=body.weight if body else 1.0,
                                owner=user.name, admin=user.is_admin, follow=body.follow if body else False)
    if body is not None and body.launcher != "none":
        service.launchers.launch(row.id, body.launcher, body.workers)
    return service.progress(row.id)


@router.get("/sessions")
def list_sessions(
    user: Caller, service: Service,
    status: Annotated[list[SessionStatus] | None, Query(description="only these statuses (repeat)")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_SESSIONS_PAGE, description="sessions per page")] = SESSIONS_PAGE,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET, description="sessions skipped")] = 0,
) -> list[dict[str, Any]]:
    """One page of the caller's sessions' progress (an admin's: all), newest first (default 50 per page, at
    most 1,000: 422 beyond)."""
    return [service.progress_of(row) for row in service.sessions(status, limit, offset, scope(user))]


@router.get("/sessions/{session_id}")
def get_session(session_id: str, user: Caller, service: Service) -> dict[str, Any]:
    """Progress: total, published, done, cached, failed, pending, current rate (tasks/s), times, owner."""
    return service.progress(session_id, scope(user))


@router.put("/sessions/{session_id}/rate")
def put_rate(session_id: str, body: RateBody, user: Caller, service: Service) -> dict[str, Any]:
    """Set the publish rate in tasks/s; takes effect within ~0.1 s."""
    service.session(session_id, scope(user))
    service.set_rate(session_id, body.rate)
    return service.progress(session_id)


@router.put("/sessions/{session_id}/weight")
def put_weight(session_id: str, body: WeightBody, user: Caller, service: Service) -> dict[str, Any]:
    """Set the session's weight (its share of shared workers); the health controller applies it."""
    service.session(session_id, scope(user))
    service.set_weight(session_id, body.weight)
    return service.progress(session_id)


@router.put("/sessions/{session_id}/workers")
def put_workers(session_id: str, body: WorkersBody, user: Caller, service: Service) -> dict[str, Any]:
    """Scale the workers of a session started with a launcher (e.g. its swarm service's replicas); past the
    session owner's ``workers`` quota, a 429 naming it and nothing changes."""
    service.session(session_id, scope(user))
    service.launchers.scale(session_id, body.workers)
    return {**service.progress(session_id), "workers": body.workers}


@router.post("/sessions/{session_id}/pause")
def pause(session_id: str, user: Caller, service: Service) -> dict[str, Any]:
    """Stop publishing (the workers finish what is queued)."""
    service.session(session_id, scope(user))
    service.pause(session_id)
    return service.progress(session_id)


@router.post("/sessions/{session_id}/resume")
def resume(session_id: str, user: Caller, service: Service) -> dict[str, Any]:
    """Publish again."""
    service.session(session_id, scope(user))
    service.resume(session_id)
    return service.progress(session_id)


@router.post("/sessions/{session_id}/cancel")
def cancel(session_id: str, user: Caller, service: Service) -> dict[str, Any]:
    """Stop publishing and purge the queue."""
    service.session(session_id, scope(user))
    service.cancel(session_id)
    return service.progress(session_id)


@router.get("/sessions/{session_id}/failures")
def failures(
    session_id: str,
    user: Caller, service: Service,
    limit: Annotated[int, Query(ge=1, le=MAX_FAILURES_PAGE, description="samples per page")] = 1000,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET, description="samples skipped")] = 0,
) -> list[dict[str, Any]]:
    """Failed samples with their reasons, by sample id, one page (at most 10,000: 422 beyond)."""
    service.session(session_id, scope(user))
    return service.failures(session_id, limit, offset)


@router.post("/sessions/{session_id}/outcomes")
def outcomes(session_id: str, body: OutcomesBody, user: Caller, service: Service) -> dict[str, Any]:
    """Workers report sample outcomes here, in batches. Only samples of this session are recorded: each other
    one (another session's, or unknown) comes back in ``rejected`` with the reason; the rest is applied."""
    applied, rejected = service.record_outcomes(session_id, [o.model_dump() for o in body.outcomes],
                                                owner=scope(user))
    return {"applied": applied, "rejected": rejected}


@router.post("/sessions/{session_id}/redeliveries")
def redeliveries(session_id: str, body: RedeliveryBody, user: Caller, service: Service) -> dict[str, bool]:
    """A worker got a redelivered message: count the attempt; ``run`` false means skip it."""
    service.session(session_id, scope(user))
    return {"run": service.redelivered(session_id, body.sample_id)}


def _experiment(row: ExperimentRow, problem: str | None, with_config: bool = False) -> dict[str, Any]:
    out = {"name": row.name, "owner": row.owner, "fingerprint": row.fingerprint, "queue": queue_name(row.name),
           "created_at": row.created_at, "updated_at": row.updated_at, "valid": problem is None, "problem": problem}
    if with_config:
        out["config"] = row.config
    return out
