"""The dashboard's credential: the API token in a cookie, for the page loads and event streams of a browser.

A browser cannot put ``Authorization: Bearer`` on a page load, a download link or an ``EventSource``; a cookie it
sends by itself. The login page (:mod:`labswarm.ui.app`) checks the pasted token and stores it in the cookie
:data:`COOKIE`: ``HttpOnly`` (no script of the page, nor an injected one, can read it), ``SameSite=Strict`` (no other
site's page makes the browser send it), ``Secure`` when served over HTTPS, ``Path=/`` (the API routes the page
calls), no expiry (gone when the browser closes). The manager's authentication
(:class:`labswarm.auth.authenticator.BearerAuth`) takes the token from there when a request has no ``Authorization``
header, and checks it exactly like a bearer token.

A request that changes state (any method but GET, HEAD, OPTIONS) is accepted on the cookie only with the header
:data:`CSRF_HEADER`, which the dashboard's ``fetch`` calls add: a custom header cannot cross origins without a CORS
preflight, which the manager never grants, so a form or a script on another origin cannot use the cookie even in
a browser that ignores ``SameSite``.

(sessionStorage + ``fetch`` with the header was the alternative; it keeps the token readable by any script of the
page, and ``EventSource`` cannot send headers, so the live streams would need the token in their URL, where logs
keep it.)
"""

from __future__ import annotations

import re

from starlette.requests import HTTPConnection

#: Name of the cookie that holds the API token.
COOKIE = "labswarm_token"
#: Header the dashboard adds to the state-changing calls it makes on the cookie (value ``1``).
CSRF_HEADER = "x-labswarm-ui"
#: Methods that change nothing: the cookie alone is enough for them.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: A token as a cookie may carry it: the visible ASCII characters of a bearer token, less ``;``, ``,``, ``"``, ``\``.
_TOKEN = re.compile(r"\A[\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]+\Z")


def cookie_token(request: HTTPConnection) -> bytes | None:
    """The token of the dashboard's cookie, when the request may authenticate with it.

    Args:
        request: the request (or websocket) being authenticated.

    Returns:
        The token as bytes; ``None`` when the request has an ``Authorization`` header (that one is checked instead),
        has no such cookie, or changes state without :data:`CSRF_HEADER` (then the missing bearer token is what
        the caller reports).
    """
    headers = request.headers
    if "authorization" in headers:
        return None
    token = request.cookies.get(COOKIE)
    if not token or not _TOKEN.match(token):
        return None
    if request.scope.get("method", "GET") not in SAFE_METHODS and headers.get(CSRF_HEADER) != "1":
        return None
    return token.encode("ascii")


def cookie_allowed(token: str) -> bool:
    """Whether ``token`` can be stored in the cookie as it is (tokens are URL-safe base64: they can)."""
    return bool(_TOKEN.match(token))
