"""Request body size limit of the manager (ASGI middleware).

A request whose ``Content-Length`` is over the limit is answered 413 before the app sees it; a body without one
(``Transfer-Encoding: chunked``) is counted as it streams in, and the request is answered 413 as soon as the count
passes the limit, before the route has the body. Either way no more than the limit (plus one chunk) is held.
"""

from __future__ import annotations

import json

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: Default limit of a request body in bytes (1 MiB): an experiment or a manifest is a few kB, a batch of worker
#: outcomes ~100 B per outcome (the worker's reporter sends at most 1,000 per request).
MAX_BODY_BYTES = 1024 * 1024
#: The largest offset, position or event id a query may name: a signed 64-bit integer, the databases' INTEGER
#: (SQLite) and BIGINT (PostgreSQL); a larger one is a 422 instead of an OverflowError (500) in the driver.
MAX_OFFSET = 2**63 - 1


def too_large(limit: int) -> str:
    """The reason a body over ``limit`` bytes is refused with."""
    return (f"request body too large: over the limit of {limit} bytes (the manager's setting max_body_bytes, "
            f"LABSWARM_MAX_BODY_BYTES)")


class BodyLimit:
    """Refuse request bodies over ``max_bytes`` with 413 ``{"detail": reason}``.

    Args:
        app: the ASGI app it wraps.
        max_bytes: the largest body accepted, in bytes (:data:`MAX_BODY_BYTES` by default; the manager passes its
            ``max_body_bytes`` setting).
    """

    def __init__(self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await _refuse(send, too_large(self.max_bytes))
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # raised where the route reads its body: the app's exception handling answers 413
                    raise HTTPException(413, too_large(self.max_bytes))
            return message

        await self.app(scope, counted, send)


def _content_length(scope: Scope) -> int | None:
    """The request's ``Content-Length``, or ``None`` when absent or not a number (the server refuses those)."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _refuse(send: Send, reason: str) -> None:
    body = json.dumps({"detail": reason}).encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
