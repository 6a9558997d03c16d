"""The dashboard's app, mounted by the manager at ``/ui``: a login page, three pages, their static files.

================================ ==============================================================================
``GET /ui/``                     overview: experiments, sessions, training jobs, totals (refreshed every 2 s)
``GET /ui/sessions/{id}``        a session: live queue depth and publish vs consume rate, progress, failures,
                                 controls (pause, resume, cancel, rate, weight, workers)
``GET /ui/jobs/{id}``            a training job: live loss and accuracy against epoch, step and wall time, the
                                 log tail, attempts, controls (halt, resume, delete), model and bundle downloads
``GET /ui/compare``              the ``labswarm compare`` runs found under ``<home>/compare`` (admins; a user
                                 sees the runs recorded with their name); ``/ui/compare/{run}``: one run's
                                 curves (accuracy and loss against wall time and samples) and table
``GET /ui/partials/...``         the overview's tables (HTML) and a session's workers and consumers (JSON)
``GET|POST /ui/login``           paste a token; ``POST /ui/logout`` forgets it
``GET /ui/static/...``           CSS, the pages' JavaScript, the vendored uPlot (no data: no login needed)
================================ ==============================================================================

The pages are authenticated by the manager's own dependency (:class:`~labswarm.auth.authenticator.BearerAuth` on the
manager's :class:`~labswarm.auth.authenticator.Authenticator`): a bearer header, or the cookie the login page sets
(:mod:`labswarm.auth.cookie`); on an open manager (no token, loopback) no login is needed, as for the API. A page
asked for without credentials answers 401 (``WWW-Authenticate: Bearer``, as the API) with the login form and no
data; the form comes back to that page. The login form and the logout are plain routes, like ``/docs``. The
pages' JavaScript calls the API routes on the same cookie. Every answer carries a Content-Security-Policy that
allows only this origin's scripts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from labswarm.auth.authenticator import BearerAuth, is_loopback
from labswarm.auth.cookie import COOKIE, CSRF_HEADER, cookie_allowed
from labswarm.errors import NotFound
from labswarm.ui import compare_runs, views

#: The templates and static files shipped in the package.
HERE = Path(__file__).parent
#: Sent with every answer of the dashboard: scripts and styles of this origin only, no framing.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "frame-ancestors 'none'; base-uri 'none'; form-action 'self'")
#: Bytes of a login form read at most.
MAX_FORM = 8192


def ui_app(manager: FastAPI) -> FastAPI:
    """The dashboard app for ``manager`` (mount it at ``/ui``).

    Args:
        manager: the manager's app; its ``state.sessions`` and ``state.auth`` are read now, its ``state.jobs``
            (set when it starts) at each request.
    """
    sessions = manager.state.sessions
    authenticator = manager.state.auth
    auth = BearerAuth(authenticator)
    templates = Jinja2Templates(directory=HERE / "templates")
    app = FastAPI(title="labswarm dashboard", docs_url=None, redoc_url=None, openapi_url=None)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")

    @app.middleware("http")
    async def security_headers(request: Request, call_next) -> Response:
        response = await call_next(request)
        response.headers.setdefault("Content-Security-Policy", CSP)
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Referrer-Policy", "same-origin")
        return response

    def render(request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        context.update(ui=root, api=root.removesuffix("/ui"), user=getattr(request.state, "user", None),
                       status_code=status, csrf_header=CSRF_HEADER)
        response = templates.TemplateResponse(request, name, context, status_code=status)
        response.headers["Cache-Control"] = "no-store"
        return response

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> Response:
        if exc.status_code == 401:  # not logged in (or a wrong cookie): the login form here, then this page
            here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            response = render(request, "login.html", 401, next=target(request, here), error=None)
            response.headers.update(exc.headers or {})
            return response
        return render(request, "error.html", exc.status_code, message=str(exc.detail))

    @app.exception_handler(NotFound)
    async def _not_found(request: Request, exc: NotFound) -> Response:
        return render(request, "error.html", 404, message=str(exc))

    def owner(request: Request) -> str | None:
        return views.owner_filter(getattr(request.state, "user", None))

    def jobs_service() -> Any:
        return getattr(manager.state, "jobs", None)

    pages = APIRouter(dependencies=[Depends(auth)])

    @pages.get("/", response_class=HTMLResponse)
    async def overview(request: Request) -> HTMLResponse:
        data = await run_in_threadpool(views.overview, sessions, jobs_service(), owner(request))
        return render(request, "overview.html", **data)

    @pages.get("/partials/overview", response_class=HTMLResponse)
    async def overview_tables(request: Request) -> HTMLResponse:
        data = await run_in_threadpool(views.overview, sessions, jobs_service(), owner(request))
        return render(request, "_overview_tables.html", **data)

    @pages.get("/sessions/{session_id}", response_class=HTMLResponse)
    async def session(request: Request, session_id: str) -> HTMLResponse:
        data = await run_in_threadpool(views.session_page, sessions, session_id, owner(request))
        return render(request, "session.html", **data)

    @pages.get("/partials/sessions/{session_id}/seen")
    async def session_seen(request: Request, session_id: str) -> dict[str, Any]:
        return await run_in_threadpool(views.session_seen, sessions, session_id, owner(request))

    @pages.get("/jobs/{job_id}", response_class=HTMLResponse)
    async def job(request: Request, job_id: str) -> HTMLResponse:
        jobs = jobs_service()
        if jobs is None:
            raise NotFound("this manager hosts no training jobs")
        data = await run_in_threadpool(views.job_page, jobs, job_id, owner(request))
        return render(request, "job.html", **data)

    @pages.get("/compare", response_class=HTMLResponse)
    async def comparisons(request: Request) -> HTMLResponse:
        runs = await run_in_threadpool(compare_runs.list_runs, sessions.settings.home, owner(request))
        return render(request, "compare_list.html", runs=runs,
                      folder=str(compare_runs.runs_folder(sessions.settings.home)))

    @pages.get("/compare/{run}", response_class=HTMLResponse)
    async def comparison(request: Request, run: str) -> HTMLResponse:
        data = await run_in_threadpool(compare_runs.load_run, sessions.settings.home, run, owner(request))
        return render(request, "compare.html", run=data)

    app.include_router(pages)

    def target(request: Request, wanted: str | None) -> str:
        """Where to go after the login: a page of the dashboard only (never another site)."""
        root = request.scope.get("root_path", "")
        parts = urlsplit(wanted or "")
        ok = (wanted and not parts.scheme and not parts.netloc and "\\" not in wanted
              and (parts.path == root or parts.path.startswith(root + "/")) and not parts.path.startswith("//"))
        return wanted if ok else root + "/"

    def open_to(request: Request) -> bool:
        return authenticator.open and is_loopback(request.client.host if request.client else "")

    # the login form and the logout are plain routes, like /docs: outside the API (and its schema), no data
    async def login_form(request: Request) -> Response:
        wanted = request.query_params.get("next")
        if open_to(request):
            return RedirectResponse(target(request, wanted), status_code=303)
        return render(request, "login.html", next=target(request, wanted), error=None)

    async def login(request: Request) -> Response:
        origin = request.headers.get("origin")
        if origin not in (None, "null") and urlsplit(origin).netloc != request.url.netloc:
            return render(request, "login.html", 403, next=target(request, None), error="cross-site login refused")
        body = await request.body()
        form = parse_qs(body[:MAX_FORM].decode("utf-8", "replace"))
        token = (form.get("token") or [""])[0].strip()
        goto = target(request, (form.get("next") or [None])[0])
        user = authenticator.user(token.encode("utf-8")) if token and cookie_allowed(token) else None
        if user is None:
            return render(request, "login.html", 401, next=goto, error="wrong token")
        response = RedirectResponse(goto, status_code=303)
        response.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/",
                            secure=request.url.scheme == "https")
        return response

    async def logout(request: Request) -> Response:
        response = RedirectResponse(request.scope.get("root_path", "") + "/login", status_code=303)
        response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
        return response

    app.add_route("/login", login_form, methods=["GET"])
    app.add_route("/login", login, methods=["POST"])
    app.add_route("/logout", logout, methods=["POST"])
    return app
