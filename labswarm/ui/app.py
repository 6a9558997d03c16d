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

:func:`ui_app` assembles the dashboard from module-level parts: the pages (:mod:`labswarm.ui.pages`, their
dependencies in :mod:`labswarm.ui.deps`), the login (:mod:`labswarm.ui.login`), the templates
(:mod:`labswarm.ui.render`).
"""

from __future__ import annotations

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import Response
from fastapi.staticfiles import StaticFiles

from labswarm.auth.authenticator import BearerAuth
from labswarm.errors import NotFound
from labswarm.ui import login, pages
from labswarm.ui.head import HeadAsGet
from labswarm.ui.render import HERE, render, target

#: Sent with every answer of the dashboard: scripts and styles of this origin only, no framing.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "frame-ancestors 'none'; base-uri 'none'; form-action 'self'")


def ui_app(manager: FastAPI) -> FastAPI:
    """The dashboard app for ``manager`` (mount it at ``/ui``).

    Args:
        manager: the manager's app; its ``state.auth`` is read now, its ``state.sessions`` and ``state.jobs``
            (:mod:`labswarm.ui.deps`) at each request.
    """
    app = FastAPI(title="labswarm dashboard", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.manager = manager
    app.state.bearer = BearerAuth(manager.state.auth)  # the manager's own authentication (labswarm.ui.deps)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    app.middleware("http")(_security_headers)
    app.add_middleware(HeadAsGet)  # HEAD wherever GET is (labswarm.ui.head)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(NotFound, _not_found)
    app.include_router(pages.router)
    # the login form and the logout are plain routes, like /docs: outside the API (and its schema), no data
    for path, endpoint, methods in login.ROUTES:
        app.add_route(path, endpoint, methods=methods)
    return app


async def _security_headers(request: Request, call_next) -> Response:
    response = await call_next(request)
    response.headers.setdefault("Content-Security-Policy", CSP)
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "same-origin")
    return response


# Starlette types a handler as taking any Exception; it calls each one for the class it is registered for only
async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException), "registered for HTTPException"
    if exc.status_code == 401:  # not logged in (or a wrong cookie): the login form here, then this page
        here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        response = render(request, "login.html", 401, next=target(request, here), error=None)
        response.headers.update(exc.headers or {})
        return response
    return render(request, "error.html", exc.status_code, message=str(exc.detail))


async def _not_found(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, NotFound), "registered for NotFound"
    return render(request, "error.html", 404, message=str(exc))
