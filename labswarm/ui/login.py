"""The dashboard's login form and logout: plain routes (:data:`ROUTES`), like ``/docs``: outside the API and its
schema, and showing no data. The login checks a pasted token against the manager's tokens and keeps it in the
browser's cookie (:mod:`labswarm.auth.cookie`)."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from fastapi import Request
from fastapi.responses import RedirectResponse, Response

from labswarm.auth.authenticator import is_loopback
from labswarm.auth.cookie import COOKIE, cookie_allowed
from labswarm.ui.deps import manager_state
from labswarm.ui.render import render, target

#: Bytes of a login form read at most.
MAX_FORM = 8192


def _open_to(request: Request) -> bool:
    """Whether the manager is open (no token) and the caller is on this machine: no login needed."""
    return manager_state(request).auth.open and is_loopback(request.client.host if request.client else "")


async def login_form(request: Request) -> Response:
    """The form, sending to ``?next=`` (a page of the dashboard) after the login; on an open manager, that page."""
    wanted = request.query_params.get("next")
    if _open_to(request):
        return RedirectResponse(target(request, wanted), status_code=303)
    return render(request, "login.html", next=target(request, wanted), error=None)


async def login(request: Request) -> Response:
    """Check the form's token (a cross-site form is refused: 403); set the cookie and go on (303), or 401 with
    the form again."""
    origin = request.headers.get("origin")
    if origin not in (None, "null") and urlsplit(origin).netloc != request.url.netloc:
        return render(request, "login.html", 403, next=target(request, None), error="cross-site login refused")
    body = await request.body()
    form = parse_qs(body[:MAX_FORM].decode("utf-8", "replace"))
    token = (form.get("token") or [""])[0].strip()
    wanted = form.get("next")
    goto = target(request, wanted[0] if wanted else None)
    authenticator = manager_state(request).auth
    user = authenticator.user(token.encode("utf-8")) if token and cookie_allowed(token) else None
    if user is None:
        return render(request, "login.html", 401, next=goto, error="wrong token")
    response = RedirectResponse(goto, status_code=303)
    response.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/",
                        secure=request.url.scheme == "https")
    return response


async def logout(request: Request) -> Response:
    """Forget the cookie and go to the login form."""
    response = RedirectResponse(request.scope.get("root_path", "") + "/login", status_code=303)
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
    return response


#: The routes: (path, endpoint, methods).
ROUTES = (("/login", login_form, ["GET"]), ("/login", login, ["POST"]), ("/logout", logout, ["POST"]))
