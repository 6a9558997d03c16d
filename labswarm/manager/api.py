"""The manager: the HTTP host of labswarm's services (FastAPI). OpenAPI docs at ``/docs``.

It assembles the app: authentication, the translation of labswarm's errors into HTTP answers, liveness,
Prometheus metrics, and each service's routes (today the sessions, :mod:`labswarm.sessions.api`).
Request bodies are limited to ``max_body_bytes`` (1 MiB; 413 past it, :mod:`labswarm.auth.limits`).
Every route but ``/health`` requires ``Authorization: Bearer <token>`` (:mod:`labswarm.auth.authenticator`: one
dependency on the app, so a route or router added later is authenticated too); ``request.state.user`` is the
caller.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from labswarm.auth.authenticator import Authenticator, BearerAuth, current_user
from labswarm.auth.limits import BodyLimit
from labswarm.auth.quotas import QuotaExceeded
from labswarm.auth.tokens import User
from labswarm.errors import BrokerError, ConfigError, DatasetError, DeployError, LabswarmError, NotFound
from labswarm.jobs.service import api as jobs_api
from labswarm.jobs.service.service import JobService
from labswarm.manager.docs import offline_docs
from labswarm.manager.metrics import metrics_registry
from labswarm.manager.queues import queue_cleaner
from labswarm.manager.quotas import router as quotas_router
from labswarm.manager.schema import contract_openapi, operation_id
from labswarm.serve import routes as models_api
from labswarm.serve.server import ModelServer
from labswarm.serve.settings import ServeSettings
from labswarm.serve.sources import JobModels
from labswarm.sessions.api import router as sessions_router
from labswarm.sessions.service import SessionService
from labswarm.sessions.stream import router as session_stream_router
from labswarm.settings import Settings
from labswarm.ui.app import ui_app


def create_app(settings: Settings, sessions: SessionService | None = None) -> FastAPI:
    """The manager's FastAPI app around a :class:`SessionService` (created from ``settings`` when not given).

    The lifespan resumes the sessions a previous manager left active and stops the publishers on shutdown.
    ``app.state.sessions`` is the session service, ``app.state.jobs`` the training-jobs service,
    ``app.state.auth`` the tokens accepted.

    Raises:
        ConfigError: a token that no ``Authorization`` header could carry, or an invalid tokens file.
    """
    authenticator = Authenticator.from_settings(settings)
    auth = BearerAuth(authenticator)  # the dependency: a request's user, or 401
    own_engine = sessions is None  # the app made the service, hence its engine: it closes its connections
    sessions = sessions or SessionService(settings)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        sessions.start()
        _app.state.queue_cleaner = cleaner = queue_cleaner(sessions)  # ended experiments' queues (issue 28)
        try:
            yield
        finally:
            if cleaner is not None:
                cleaner.stop()
            sessions.stop()
            if own_engine:  # close the pool's connections now, not when the garbage collector finds them
                sessions.engine.dispose()  # (the engine stays usable: a later use opens new ones)

    # one dependency on the app: every route, of this module or of a router included later, is authenticated
    # (BearerAuth lets /health through); /docs and /openapi.json are not API routes and stay open
    app = FastAPI(title="labswarm manager", version="0.1.0", lifespan=lifespan,
                  description="Experiments, sessions, publish rates and progress of labswarm.",
                  dependencies=[Depends(auth)], generate_unique_id_function=operation_id,
                  docs_url=None, redoc_url=None)  # issue 29: /docs with its own assets, offline
    offline_docs(app)  # issue 29 (labswarm.manager.docs)
    app.openapi = lambda: contract_openapi(app)  # type: ignore[method-assign]  # issue 28: the schema as contract
    app.state.sessions = sessions
    app.state.auth = authenticator
    serving = ServeSettings()  # issue 25: the prediction endpoint's limits (LABSWARM_PREDICT_*)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes,  # 413 past LABSWARM_MAX_BODY_BYTES,
                       routes=models_api.body_limits(serving))  # and past ..._PREDICT_MAX_REQUEST_BYTES on /predict

    _error_handlers(app)

    @app.get("/health")
    def health() -> dict[str, str]:
        """Liveness."""
        return {"status": "ok"}

    @app.get("/v1/whoami")
    def whoami(user: Annotated[User, Depends(current_user)]) -> dict[str, str]:
        """The caller as its token makes it: ``{"name": ..., "role": "admin" | "user"}`` (what a client checks
        before an operation only an admin may do safely, e.g. ``labswarm store gc``, which must see every
        user's experiments)."""
        return {"name": user.name, "role": user.role}

    app.include_router(sessions_router)  # authenticated by the app's dependency; the service: app.state.sessions
    jobs = JobService(sessions)
    registry = metrics_registry(sessions, jobs)  # issue 28: sessions, jobs, process, build info

    @app.get("/metrics", response_class=PlainTextResponse)
    def prometheus_metrics() -> PlainTextResponse:
        """Prometheus metrics: the sessions' and the jobs' progress, the process, the build (see
        :mod:`labswarm.manager.metrics`)."""
        return PlainTextResponse(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    authenticator.add_scoped(jobs.attempt_user)  # each attempt's own token: its learners' report route only
    app.state.jobs = jobs  # the jobs routes' service (labswarm.jobs.service.api.job_service); started by its lifespan
    app.include_router(jobs_api.router)  # authenticated by the app's dependency
    models_api.mount(app, ModelServer(JobModels(jobs), serving))  # issue 25: /v1/models/{job}/predict
    app.include_router(session_stream_router)  # GET /sessions/{id}/events (labswarm.sessions.stream)
    app.include_router(quotas_router)  # issue 26: /v1/quotas, an admin's (labswarm.manager.quotas)
    app.mount("/ui", ui_app(app))  # the dashboard (labswarm.ui), authenticated on the same tokens
    return app


def _error_handlers(app: FastAPI) -> None:
    """Translate labswarm's errors and invalid requests into HTTP answers."""

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
        (QuotaExceeded, 429),  # a user's quota (labswarm.auth.quotas): the message names it
        (DeployError, 502),  # the Docker engine refused or could not be reached: the engine's reason
        (BrokerError, 502),  # the broker refused the manager's login or could not be reached
        (LabswarmError, 409),  # Conflict, and anything else labswarm refuses on purpose (e.g. queue arguments)
    ):
        app.add_exception_handler(error, _detail(status))


def _detail(status: int):
    """An exception handler answering ``status`` with ``{"detail": message}``."""

    async def handler(_request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=status)

    return handler
