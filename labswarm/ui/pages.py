"""The dashboard's pages (:data:`router`), each behind the manager's authentication (:func:`~labswarm.ui.deps.
authenticated`) and showing the caller's objects only (an admin's: every object)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse

from labswarm.errors import NotFound
from labswarm.ui import compare_runs, views
from labswarm.ui.deps import Jobs, Owner, Sessions, authenticated
from labswarm.ui.render import render

#: The pages: overview, a session, a training job, the comparison runs, and the overview's live parts.
router = APIRouter(dependencies=[Depends(authenticated)])


@router.get("/", response_class=HTMLResponse)
async def overview(request: Request, sessions: Sessions, jobs: Jobs, owner: Owner) -> HTMLResponse:
    data = await run_in_threadpool(views.overview, sessions, jobs, owner)
    return render(request, "overview.html", **data)


@router.get("/partials/overview", response_class=HTMLResponse)
async def overview_tables(request: Request, sessions: Sessions, jobs: Jobs, owner: Owner) -> HTMLResponse:
    data = await run_in_threadpool(views.overview, sessions, jobs, owner)
    return render(request, "_overview_tables.html", **data)


@router.get("/sessions/{session_id}", response_class=HTMLResponse)
async def session(request: Request, session_id: str, sessions: Sessions, owner: Owner) -> HTMLResponse:
    data = await run_in_threadpool(views.session_page, sessions, session_id, owner)
    return render(request, "session.html", **data)


@router.get("/partials/sessions/{session_id}/seen")
async def session_seen(session_id: str, sessions: Sessions, owner: Owner) -> dict[str, Any]:
    return await run_in_threadpool(views.session_seen, sessions, session_id, owner)


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
async def job(request: Request, job_id: str, jobs: Jobs, owner: Owner) -> HTMLResponse:
    if jobs is None:
        raise NotFound("this manager hosts no training jobs")
    data = await run_in_threadpool(views.job_page, jobs, job_id, owner)
    return render(request, "job.html", **data)


@router.get("/compare", response_class=HTMLResponse)
async def comparisons(request: Request, sessions: Sessions, owner: Owner) -> HTMLResponse:
    runs = await run_in_threadpool(compare_runs.list_runs, sessions.settings.home, owner)
    return render(request, "compare_list.html", runs=runs,
                  folder=str(compare_runs.runs_folder(sessions.settings.home)))


@router.get("/compare/{run}", response_class=HTMLResponse)
async def comparison(request: Request, run: str, sessions: Sessions, owner: Owner) -> HTMLResponse:
    data = await run_in_threadpool(compare_runs.load_run, sessions.settings.home, run, owner)
    return render(request, "compare.html", run=data)
