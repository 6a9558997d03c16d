"""A shorter way through ``labswarm serve``'s app for ``POST /v1/models/{job}/predict``: :class:`FastPredict`.

FastAPI's way to the route costs one client's request ~0.4 ms of the event loop before and around the route's own
work (py-spy of the server, 2026-11-27: routing, two exit stacks, the endpoint's context, the dependencies solved
each request (the app-wide authentication, then the path and query parameters checked by pydantic), the route's
exception wrappers: ~39 % of the loop's busy time against ~28 % for the route itself). This middleware calls the
same route function (:func:`labswarm.serve.routes.predict`) with the same authentication
(:class:`~labswarm.auth.authenticator.BearerAuth`) and the app's own handler for an ``HTTPException``, so the
answers are the route's; a request whose query it does not read as FastAPI would (another parameter, a repeated
one, a value the route's ``Query`` declarations refuse) takes FastAPI's way, which answers it (its 422 naming the
parameter). The OpenAPI schema is the route's, unchanged.
"""

from __future__ import annotations

import re
from typing import Any

from starlette.datastructures import QueryParams
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from labswarm.auth.authenticator import BearerAuth
from labswarm.serve import routes

_PATH = re.compile(routes.PREDICT_PATH.replace("[^/]+", "([^/]+)"))


class FastPredict:
    """ASGI middleware of ``labswarm serve``'s app: a prediction request straight to its route (see the module).

    Args:
        app: the ASGI app it wraps (the rest of the stack: another request goes there).
        auth: the app's authentication dependency (the same object FastAPI would call).
    """

    def __init__(self, app: ASGIApp, auth: BearerAuth) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = _PATH.fullmatch(scope.get("path", "")) if scope["type"] == "http" and scope["method"] == "POST" \
            else None
        query = _query(scope.get("query_string", b"")) if match else None
        if match is None or query is None:
            await self.app(scope, receive, send)
            return
        request: Request = Request(scope, receive, send)
        try:
            await self.auth(request)
            response = await routes.predict(match[1], request, **query)
        except HTTPException as exc:
            handler = _handler(scope["app"].exception_handlers, exc)
            if handler is None:
                raise
            response = await handler(request, exc)
        await response(scope, receive, send)


def _query(raw: bytes) -> dict[str, Any] | None:
    """The route's ``top`` and ``name`` from the query string as FastAPI gives them (Starlette's parsing), or
    ``None`` where FastAPI is to judge it: another parameter, a repeated one, a ``top`` that is not a plain
    integer of at least 1, a ``name`` outside 1-255 characters."""
    if not raw:
        return {"top": None, "name": None}
    items = QueryParams(raw).multi_items()
    keys = [key for key, _ in items]
    if len(set(keys)) != len(keys) or not set(keys) <= {"top", "name"}:
        return None
    values: dict[str, Any] = {"top": None, "name": None}
    for key, value in items:
        if key == "top":
            if not (value.isascii() and value.isdigit() and str(int(value)) == value and int(value) >= 1):
                return None
            values["top"] = int(value)
        elif 1 <= len(value) <= 255:
            values["name"] = value
        else:
            return None
    return values


def _handler(handlers: dict[Any, Any], exc: Exception) -> Any:
    """The app's handler for ``exc`` (the first of its classes with one), as Starlette's exception middleware
    looks it up."""
    return next((handlers[cls] for cls in type(exc).__mro__ if cls in handlers), None)
