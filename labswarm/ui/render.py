"""The dashboard's HTML: its templates rendered for a request, and where a login may send the browser."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fastapi import Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

from labswarm.auth.cookie import CSRF_HEADER

#: The templates and static files shipped in the package.
HERE = Path(__file__).parent


@cache
def _templates() -> Jinja2Templates:
    return Jinja2Templates(directory=HERE / "templates")


def render(request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
    """The template ``name`` as an uncached HTML answer.

    Args:
        request: the request answered (its ``root_path`` gives the dashboard's and the API's URLs).
        name: the template's file name.
        status: the answer's status code.
        **context: what the template shows; ``ui``, ``api``, ``user``, ``status_code`` and ``csrf_header`` are
            added.
    """
    root = request.scope.get("root_path", "")
    context.update(ui=root, api=root.removesuffix("/ui"), user=getattr(request.state, "user", None),
                   status_code=status, csrf_header=CSRF_HEADER)
    response = _templates().TemplateResponse(request, name, context, status_code=status)
    response.headers["Cache-Control"] = "no-store"
    return response


def target(request: Request, wanted: str | None) -> str:
    """Where to go after the login: ``wanted`` when it is a page of the dashboard (never another site), else the
    overview."""
    root = request.scope.get("root_path", "")
    parts = urlsplit(wanted or "")
    if (wanted and not parts.scheme and not parts.netloc and "\\" not in wanted
            and (parts.path == root or parts.path.startswith(root + "/")) and not parts.path.startswith("//")):
        return wanted
    return root + "/"
