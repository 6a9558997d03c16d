"""The training jobs' HTTP routes, ``/v1/jobs``: :data:`router`, included by the manager beside the sessions'
routes. The handlers reach the :class:`~labswarm.jobs.service.service.JobService` through a dependency
(:func:`job_service`: ``app.state.jobs``); the router's lifespan starts and stops its lifecycle thread.

============================================ ===========================================================
``POST /v1/jobs``                            submit a manifest (YAML or JSON body): 201, ``Location``;
                                             ``?reuse=true``: a completed identical job, 200
``POST /v1/jobs/validate``                   check a manifest, its experiment and stores; create nothing
``GET /v1/jobs``                             list (``status`` repeated, ``name``, ``offset``, ``limit``)
``GET /v1/jobs/{id}``                        status, reason, error, timestamps, attempts, queue position
``PATCH /v1/jobs/{id}``                      ``{"status": "halt"}`` or ``{"status": "resume"}``, or a live
                                             change ``{"training": {"learning_rate": ...}}`` (issue 25)
``DELETE /v1/jobs/{id}``                     stop it and delete what it owns: 204
``GET /v1/jobs/{id}/attempts``               each attempt: start, end, exit code, reason, checkpoints
``GET /v1/jobs/{id}/logs``                   log lines, paged: ``pos`` (after this sequence number),
                                             ``since`` (ISO time), ``pagesize``
``GET /v1/jobs/{id}/metrics``                metrics records, each epoch once
``GET /v1/jobs/{id}/model``                  the trained model file
``GET /v1/jobs/{id}/bundle``                 a zip: model, logs, metrics, resolved manifest, versions
``GET /v1/jobs/{id}/events``                 Server-Sent Events: ``status``, ``log``, ``metric``,
                                             ``checkpoint``, ``attempt``, ``progress``, ``plateau``,
                                             ``change`` (a live change: asked, and applied by each
                                             learner); id = the per-job number;
                                             data = the payload with ``seq``, ``attempt`` and ``stamp`` (when
                                             the learner or the manager made the event);
                                             ``Last-Event-ID`` (or ``?after=``) resumes after it (400 when
                                             not a number); the stream ends after the terminal status, and a
                                             reconnection then gets 204 (``EventSource`` stops)
``POST /v1/jobs/{id}/attempts/{n}/reports``  a learner's report (:mod:`labswarm.jobs.learner.reporter`)
============================================ ===========================================================

Errors: a bad manifest is 422 with ``{"detail": [{"path": "restart.backoff_s", "reason": ...}]}``; an unknown
job 404; a refused state change (halting a completed job) 409; a user's ``framework: command`` 403.

Owners (issue 11): a job is its submitter's. A user lists and reaches only their own jobs (another user's job is
a 404 on every route: its existence is not disclosed), an admin every job. Reports come with the attempt's own
token (:mod:`labswarm.jobs.records.credentials`), which opens that route and no other, or from an admin.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.background import BackgroundTask

from labswarm import sse
from labswarm.auth.authenticator import current_user
from labswarm.auth.limits import MAX_OFFSET
from labswarm.auth.tokens import User
from labswarm.errors import NotFound
from labswarm.jobs.records import events as job_events
from labswarm.jobs.records.credentials import report_scope
from labswarm.jobs.service import live
from labswarm.jobs.service.service import JobService
from labswarm.jobs.spec.errors import AdminOnly

#: Seconds between two reads of a job's events while a stream is idle.
POLL_S = 0.2
#: Seconds between two keep-alive comments on an idle stream.
KEEPALIVE_S = 15.0


class StoppingChange(BaseModel):
    """A live change of the early stopping."""

    model_config = ConfigDict(extra="forbid")

    patience: int = Field(ge=1)


class TrainingChange(BaseModel):
    """A live change of a running job's training (issue 25): applied by every learner at the next epoch."""

    model_config = ConfigDict(extra="forbid")

    learning_rate: float | None = Field(None, gt=0)
    early_stopping: StoppingChange | None = None


class StatusBody(BaseModel):
    """A change asked of a job: its state (``status``), or its training (``training``), one of them."""

    model_config = ConfigDict(extra="forbid")

    status: Literal["halt", "resume"] | None = None
    training: TrainingChange | None = None

    @model_validator(mode="after")
    def _one(self) -> StatusBody:
        if (self.status is None) == (self.training is None):
            raise ValueError("give status (halt, resume) or training (learning_rate, early_stopping.patience)")
        if self.training is not None and not self.training.model_dump(exclude_none=True):
            raise ValueError("training: give learning_rate or early_stopping.patience")
        return self


class ReportEvent(BaseModel):
    """One event of a learner's report."""

    n: int = Field(ge=0)
    kind: Literal["log", "metric", "phase", "checkpoint", "progress", "plateau", "change"]  # plateau, change: 25
    key: str | None = Field(None, max_length=64)
    payload: dict[str, Any]
    time: float | None = None


class ReportBody(BaseModel):
    """A learner's report: its rank, progress and new events."""

    rank: int = Field(0, ge=0)
    progress: dict[str, Any] = Field(default_factory=dict)
    events: list[ReportEvent] = Field(default_factory=list, max_length=10_000)


Caller = Annotated[User, Depends(current_user)]


async def job_service(request: Request) -> JobService:
    """Route dependency: the manager's job service (``app.state.jobs``, set by the app that mounts
    :data:`router`)."""
    return request.app.state.jobs


Service = Annotated[JobService, Depends(job_service)]


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Start the lifecycle thread of ``app.state.jobs`` with the app, stop it on shutdown."""
    service: JobService = app.state.jobs
    service.start()
    try:
        yield
    finally:
        service.stop()


#: The routes of the training-jobs service; the app that includes it sets ``app.state.jobs`` (a
#: :class:`JobService`) and authenticates every route (the manager's app-wide dependency).
router = APIRouter(prefix="/v1/jobs", tags=["jobs"], lifespan=lifespan)


def _owner(user: User) -> str | None:
    """The owner filter of ``user``'s requests: ``None`` for an admin (every job), else their name."""
    return None if user.is_admin else user.name


async def _manifest_text(request: Request) -> str:
    return (await request.body()).decode("utf-8", "replace")


@router.post("", status_code=201)
async def create(request: Request, response: Response, user: Caller, service: Service,
                 reuse: bool = False) -> dict[str, Any]:
    """Submit a job, owned by the caller: the body is its manifest, YAML or JSON. 201 with the job and its
    ``Location``; 403 for a user's ``framework: command`` (admins only). With ``reuse=true``, a completed job of
    the caller with the same configuration, data and code (its fingerprint) is answered instead, 200 and
    ``"reused": true``, and nothing is queued."""
    try:
        job = await run_in_threadpool(service.create, await _manifest_text(request), user.name, admin=user.is_admin,
                                      reuse=reuse)
    except AdminOnly as exc:
        raise HTTPException(403, str(exc)) from None
    reused = reuse and job.status == "completed"  # a new job is queued
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    if reused:
        response.status_code = 200
    return {**await run_in_threadpool(service.describe, job.id), "reused": reused}


@router.post("/validate")
async def validate(request: Request, user: Caller, service: Service) -> dict[str, Any]:
    """Check a manifest, its experiment and the reachability of its stores, without creating a job (403 as
    for a submit)."""
    try:
        manifest, experiment = await run_in_threadpool(service.validate, await _manifest_text(request),
                                                       user.name, admin=user.is_admin)
    except AdminOnly as exc:
        raise HTTPException(403, str(exc)) from None
    return {"valid": True, "manifest": manifest.resolved(experiment)}


@router.get("")
def list_jobs(user: Caller, service: Service, status: Annotated[list[str] | None, Query()] = None,
              name: str | None = None, offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
              limit: Annotated[int, Query(ge=1, le=500)] = 50) -> dict[str, Any]:
    """A page of the caller's jobs (an admin's: every job), newest first."""
    return service.list(status=status, name=name, offset=offset, limit=limit, owner=_owner(user))


@router.get("/{job_id}")
def show(job_id: str, user: Caller, service: Service) -> dict[str, Any]:
    """One job: status, reason, error code, timestamps per phase, attempts, queue position, progress."""
    return service.describe(job_id, _owner(user))


@router.patch("/{job_id}")
def change(job_id: str, body: StatusBody, user: Caller, service: Service) -> dict[str, Any]:
    """Halt (cooperatively: the learners checkpoint and exit), resume (from the last checkpoint), or change the
    training live (``{"training": {"learning_rate": ..., "early_stopping": {"patience": ...}}}``: every learner
    applies it at the next epoch; answered with the ``change`` event, :mod:`labswarm.jobs.service.live`)."""
    owner = _owner(user)
    if body.training is not None:
        return live.change_training(service, job_id, body.training.model_dump(exclude_none=True), owner, user.name)
    return service.halt(job_id, owner) if body.status == "halt" else service.resume(job_id, owner)


@router.delete("/{job_id}", status_code=204)
def delete(job_id: str, user: Caller, service: Service) -> Response:
    """Stop the job and delete its processes, working folders and results; the user's data stays."""
    service.delete(job_id, _owner(user))
    return Response(status_code=204)


@router.get("/{job_id}/attempts")
def attempts(job_id: str, user: Caller, service: Service) -> dict[str, Any]:
    """The job's attempts."""
    return {"attempts": service.attempts(job_id, owner=_owner(user))}


@router.get("/{job_id}/logs")
def logs(job_id: str, user: Caller, service: Service, since: datetime | None = None,
         pos: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
         pagesize: Annotated[int, Query(ge=1, le=5000)] = 100) -> dict[str, Any]:
    """A page of log lines after sequence number ``pos``; ``next_pos`` continues."""
    return service.logs(job_id, since=since, pos=pos, pagesize=pagesize, owner=_owner(user))


@router.get("/{job_id}/metrics")
def metrics(job_id: str, user: Caller, service: Service) -> dict[str, Any]:
    """The metrics records, each epoch once, in the order they were reported."""
    return {"metrics": service.metrics(job_id, _owner(user))}


@router.get("/{job_id}/model")
def model(job_id: str, user: Caller, service: Service) -> FileResponse:
    """The trained model file (``labswarm`` framework)."""
    path = service.model_file(job_id, _owner(user))
    return FileResponse(path, media_type="application/octet-stream", filename=path.name,
                        background=BackgroundTask(shutil.rmtree, path.parent, ignore_errors=True))


@router.get("/{job_id}/bundle")
def bundle(job_id: str, user: Caller, service: Service) -> FileResponse:
    """A zip: model, logs, metrics, the resolved manifest, the experiment's fingerprint, the feature store's
    versions and the library versions (:mod:`labswarm.jobs.service.bundle`)."""
    path = service.bundle_file(job_id, _owner(user))
    return FileResponse(path, media_type="application/zip", filename=path.name,
                        background=BackgroundTask(shutil.rmtree, path.parent, ignore_errors=True))


@router.get("/{job_id}/events", response_model=None)
async def stream(job_id: str, request: Request, user: Caller, service: Service,
                 after: Annotated[int | None, Query(ge=0, le=MAX_OFFSET)] = None,
                 last_id: Annotated[int | None, Depends(sse.last_event_id)] = None) -> Response:
    """Server-Sent Events of the job from the event after ``Last-Event-ID`` (or ``after``) on; 204 when the job
    is over and every event up to its terminal status was sent (a browser's ``EventSource`` stops there);
    400 for a ``Last-Event-ID`` that is not an event number."""
    start = after if after is not None else last_id or 0
    owner = _owner(user)
    rows, terminal = await run_in_threadpool(service.events, job_id, start, 1, owner)  # 404 before the stream
    if terminal and not rows:
        return sse.finished()
    return StreamingResponse(_sse(service, request, job_id, start, owner), media_type=sse.MEDIA_TYPE,
                             headers=sse.HEADERS)


async def _sse(service: JobService, request: Request, job_id: str, start: int,
               owner: str | None) -> AsyncIterator[str]:
    """The job's events after ``start`` as Server-Sent Events, until the terminal status, the job's deletion or
    the client's disconnection; a keep-alive comment every :data:`KEEPALIVE_S` of silence."""
    seq, idle = start, 0.0
    while not await request.is_disconnected():
        try:
            rows, terminal = await run_in_threadpool(service.events, job_id, seq, 500, owner)
        except NotFound:
            return  # deleted
        for row in rows:
            seq = row.seq
            yield sse.event(row.seq, row.kind, {**row.payload, "seq": row.seq, "attempt": row.attempt,
                                                "stamp": job_events.iso(row.time)})
        if terminal and len(rows) < 500:
            return  # everything up to the terminal status is sent
        if rows:
            idle = 0.0
            continue
        await asyncio.sleep(POLL_S)
        idle += POLL_S
        if idle >= KEEPALIVE_S:
            idle = 0.0
            yield ": keep-alive\n\n"


@router.post("/{job_id}/attempts/{attempt}/reports")
def report(job_id: str, attempt: int, body: ReportBody, user: Caller, service: Service) -> dict[str, Any]:
    """A learner's report: heartbeat, progress, log lines, metrics; answers what it stored and whether to
    halt (409: this attempt is over, the learner must stop). Sent with the attempt's own token (or an
    admin's); a user's token is refused (404 on another user's job, 403 on their own)."""
    if user.scope is not None:
        if user.scope != report_scope(job_id, attempt):  # the app's authentication checked it too
            raise HTTPException(403, "this token is another attempt's")
    elif not user.is_admin:
        with service.db() as db:
            service.get(db, job_id, user.name)  # 404: not theirs
        raise HTTPException(403, "reports come from the attempt's learners, with the attempt's own token")
    return service.report(job_id, attempt, body.model_dump())
