"""The dashboard's route dependencies: what a page needs, read from the app's state at each request.

:func:`~labswarm.ui.app.ui_app` keeps the manager's app in ``app.state.manager`` and the dashboard's
authentication in ``app.state.bearer``; the manager's ``state.sessions`` and ``state.auth`` are set when it is
built, its ``state.jobs`` when it hosts the jobs service (read at each request: a manager without it shows no
jobs).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from starlette.datastructures import State

from labswarm.auth.tokens import User
from labswarm.jobs.service.service import JobService
from labswarm.sessions.service import SessionService
from labswarm.ui import views


def manager_state(request: Request) -> State:
    """The state of the manager's app that mounts the dashboard ``request`` reached."""
    return request.app.state.manager.state


async def authenticated(request: Request) -> User | None:
    """The pages' dependency: the manager's authentication (a bearer header or the login cookie); sets
    ``request.state.user``.

    Raises:
        HTTPException: 401 without valid credentials (the dashboard answers it with the login form).
    """
    return await request.app.state.bearer(request)


async def session_service(request: Request) -> SessionService:
    """The manager's session service."""
    return manager_state(request).sessions


async def job_service(request: Request) -> JobService | None:
    """The manager's job service, or ``None`` when it hosts none."""
    return getattr(manager_state(request), "jobs", None)


async def owner(request: Request) -> str | None:
    """The owner filter of the caller's pages: ``None`` for an admin (everything), else their name."""
    return views.owner_filter(getattr(request.state, "user", None))


Sessions = Annotated[SessionService, Depends(session_service)]
Jobs = Annotated[JobService | None, Depends(job_service)]
Owner = Annotated[str | None, Depends(owner)]
