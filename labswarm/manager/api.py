"""The manager's HTTP API (FastAPI). OpenAPI docs at ``/docs``.

Mutating endpoints require ``Authorization: Bearer <LABSWARM_API_TOKEN>`` when that token is set.
"""

from __future__ import annotations

import secrets
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel, Field

from labswarm.errors import ConfigError, DatasetError, DeployError, LabswarmError
from labswarm.manager.metrics import SessionCollector
from labswarm.manager.service import Manager, NotFound
from labswarm.queue.app import queue_name
from labswarm.settings import Settings


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
    launcher: Literal["none", "swarm"] = Field("none", description="who runs the workers: none (someone else), "
                                               "swarm (a docker swarm service the manager creates and removes)")
    workers: int = Field(0, ge=0, le=10_000, description="workers the launcher starts")


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
    outcomes: list[Outcome]


class RedeliveryBody(BaseModel):
    sample_id: str


def create_app(settings: Settings, manager: Manager | None = None) -> FastAPI:
    """The FastAPI app around a :class:`Manager` (created from ``settings`` when not given).

    The lifespan resumes the sessions a previous manager left active and stops the publishers on shutdown.
    """
    manager = manager or Manager(settings)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        manager.start()
        try:
            yield
        finally:
            manager.stop()

    app = FastAPI(title="labswarm manager", version="0.1.0", lifespan=lifespan,
                  description="Experiments, sessions, publish rates and progress of labswarm.")
    app.state.manager = manager

    def auth(authorization: Annotated[str | None, Header()] = None) -> None:
        token = settings.api_token
        if token and not (authorization and secrets.compare_digest(authorization, f"Bearer {token}")):
            raise HTTPException(401, "missing or wrong API token (Authorization: Bearer <LABSWARM_API_TOKEN>)")

    mutating = [Depends(auth)]

    @app.exception_handler(ConfigError)
    async def _config(_request: Request, exc: ConfigError) -> JSONResponse:
        detail = [{"path": path, "reason": reason} for path, reason in exc.errors]
        return JSONResponse({"detail": detail}, status_code=422)

    @app.exception_handler(RequestValidationError)
    async def _request(_request: Request, exc: RequestValidationError) -> JSONResponse:
        # the same shape as a bad experiment: each invalid field with its dotted path and the reason
        detail = [{"path": ".".join(str(p) for p in e["loc"] if p != "body"), "reason": e["msg"]}
                  for e in exc.errors()]
        return JSONResponse({"detail": detail}, status_code=422)

    @app.exception_handler(DatasetError)
    async def _dataset(_request: Request, exc: DatasetError) -> JSONResponse:
        return JSONResponse({"detail": [{"path": "dataset", "reason": str(exc)}]}, status_code=422)

    # errors answered with their message; the most specific class wins (Starlette looks handlers up by MRO)
    for error, status in (
        (NotFound, 404),
        (DeployError, 502),  # the Docker engine refused or could not be reached: the engine's reason
        (LabswarmError, 409),  # Conflict, and anything else labswarm refuses on purpose (e.g. queue arguments)
    ):
        app.add_exception_handler(error, _detail(status))

    @app.get("/health")
    def health() -> dict[str, str]:
        """Liveness."""
        return {"status": "ok"}

    registry = CollectorRegistry()
    registry.register(SessionCollector(manager))

    @app.get("/metrics", response_class=PlainTextResponse)
    def metrics() -> PlainTextResponse:
        """Prometheus metrics: samples per status, totals, publish rates of every session."""
        return PlainTextResponse(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/settings")
    def worker_settings() -> dict[str, Any]:
        """What a worker needs besides the experiment: the broker URL, the report interval, the queue bound."""
        return {"broker_url": manager.broker_url, "report_interval": settings.report_interval,
                "max_queue_length": settings.max_queue_length}

    @app.post("/experiments", status_code=201, dependencies=mutating)
    async def post_experiment(request: Request) -> dict[str, Any]:
        """Register an experiment from YAML (``Content-Type: application/yaml``) or JSON.

        422 lists each invalid field with its path and the reason.
        """
        body = (await request.body()).decode("utf-8", errors="replace")
        if "json" in request.headers.get("content-type", ""):
            import json

            try:
                data: Any = json.loads(body)
            except ValueError as exc:
                raise ConfigError([("", f"invalid JSON: {exc}")]) from None
        else:
            data = body
        row = manager.register_experiment(data)
        return _experiment(row)

    @app.get("/experiments")
    def list_experiments() -> list[dict[str, Any]]:
        return [_experiment(row) for row in manager.experiments()]

    @app.get("/experiments/{name}")
    def get_experiment(name: str) -> dict[str, Any]:
        return _experiment(manager.experiment(name), with_config=True)

    @app.get("/experiments/{name}/config")
    def get_config(name: str) -> dict[str, Any]:
        """The validated configuration; what a worker fetches once when it starts."""
        return manager.experiment(name).config

    @app.post("/experiments/{name}/sessions", status_code=201, dependencies=mutating)
    def start_session(name: str, body: SessionBody | None = None) -> dict[str, Any]:
        """Start a session: publish every sample of the experiment to its queue."""
        row = manager.start_session(name, body.rate if body else None, weight=body.weight if body else 1.0)
        if body is not None and body.launcher != "none":
            manager.launch(row.id, body.launcher, body.workers)
        return manager.progress(row.id)

    @app.get("/sessions")
    def list_sessions() -> list[dict[str, Any]]:
        return [manager.progress(row.id) for row in manager.sessions()]

    @app.get("/sessions/{session_id}")
    def get_session(session_id: str) -> dict[str, Any]:
        """Progress: total, published, done, cached, failed, pending, current rate (tasks/s), times."""
        return manager.progress(session_id)

    @app.put("/sessions/{session_id}/rate", dependencies=mutating)
    def put_rate(session_id: str, body: RateBody) -> dict[str, Any]:
        """Set the publish rate in tasks/s; takes effect within ~0.1 s."""
        manager.set_rate(session_id, body.rate)
        return manager.progress(session_id)

    @app.put("/sessions/{session_id}/weight", dependencies=mutating)
    def put_weight(session_id: str, body: WeightBody) -> dict[str, Any]:
        """Set the session's weight (its share of shared workers); the health controller applies it."""
        manager.set_weight(session_id, body.weight)
        return manager.progress(session_id)

    @app.put("/sessions/{session_id}/workers", dependencies=mutating)
    def put_workers(session_id: str, body: WorkersBody) -> dict[str, Any]:
        """Scale the workers of a session started with a launcher (e.g. its swarm service's replicas)."""
        manager.set_workers(session_id, body.workers)
        return {**manager.progress(session_id), "workers": body.workers}

    @app.post("/sessions/{session_id}/pause", dependencies=mutating)
    def pause(session_id: str) -> dict[str, Any]:
        manager.pause(session_id)
        return manager.progress(session_id)

    @app.post("/sessions/{session_id}/resume", dependencies=mutating)
    def resume(session_id: str) -> dict[str, Any]:
        manager.resume(session_id)
        return manager.progress(session_id)

    @app.post("/sessions/{session_id}/cancel", dependencies=mutating)
    def cancel(session_id: str) -> dict[str, Any]:
        """Stop publishing and purge the queue."""
        manager.cancel(session_id)
        return manager.progress(session_id)

    @app.get("/sessions/{session_id}/failures")
    def failures(session_id: str, limit: int = 1000, offset: int = 0) -> list[dict[str, Any]]:
        """Failed samples with their reasons."""
        return manager.failures(session_id, limit, offset)

    @app.post("/sessions/{session_id}/outcomes", dependencies=mutating)
    def outcomes(session_id: str, body: OutcomesBody) -> dict[str, int]:
        """Workers report sample outcomes here, in batches."""
        n = manager.record_outcomes(session_id, [o.model_dump() for o in body.outcomes])
        return {"applied": n}

    @app.post("/sessions/{session_id}/redeliveries", dependencies=mutating)
    def redeliveries(session_id: str, body: RedeliveryBody) -> dict[str, bool]:
        """A worker got a redelivered message: count the attempt; ``run`` false means skip it."""
        return {"run": manager.redelivered(session_id, body.sample_id)}

    return app


def _detail(status: int):
    """An exception handler answering ``status`` with ``{"detail": message}``."""

    async def handler(_request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=status)

    return handler


def _experiment(row, with_config: bool = False) -> dict[str, Any]:
    out = {"name": row.name, "fingerprint": row.fingerprint, "queue": queue_name(row.name),
           "created_at": row.created_at, "updated_at": row.updated_at}
    if with_config:
        out["config"] = row.config
    return out
