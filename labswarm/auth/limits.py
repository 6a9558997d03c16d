"""Request body size limit of the manager (ASGI middleware).

A request whose ``Content-Length`` is over the limit is answered 413 before the app sees it; a body without one
(``Transfer-Encoding: chunked``) is counted as it streams in, and the request is answered 413 as soon as the count
passes the limit, before the route has the body. Either way no more than the limit (plus one chunk) is held.

A GET, HEAD or OPTIONS route reads no body, but a streamed response (the event streams) listens for the client's
disconnect, and so receives an unread body while it streams: past the limit the middleware sends the 413 itself
when nothing was sent yet, and the app receives ``http.disconnect``; once the response has started, the rest of
the body is dropped as it arrives (the route reads none) and the stream goes on. Raising there, in the
listener's task, cut the stream with an "Exception in ASGI application".
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: Default limit of a request body in bytes (1 MiB): an experiment or a manifest is a few kB, a batch of worker
#: outcomes ~100 B per outcome (the worker's reporter sends at most 1,000 per request).
MAX_BODY_BYTES = 1024 * 1024
#: The largest offset, position or event id a query may name: a signed 64-bit integer, the databases' INTEGER
#: (SQLite) and BIGINT (PostgreSQL); a larger one is a 422 instead of an OverflowError (500) in the driver.
MAX_OFFSET = 2**63 - 1
#: Methods whose routes read no request body (RFC 9110 gives such a body no meaning).
NO_BODY_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def too_large(limit: int, setting: str = "max_body_bytes") -> str:
    """The reason a body over ``limit`` bytes (the value of ``setting``) is refused with."""
    return (f"request body too large: over the limit of {limit} bytes (the manager's setting {setting}, "
            f"LABSWARM_{setting.upper()})")


class BodyLimit:
    """Refuse request bodies over ``max_bytes`` with 413 ``{"detail": reason}``.

    Args:
        app: the ASGI app it wraps.
        max_bytes: the largest body accepted, in bytes (:data:`MAX_BODY_BYTES` by default; the manager passes its
            ``max_body_bytes`` setting).
        routes: other limits for some paths: a regular expression that the whole path matches -> (the largest
            body, the setting it comes from), e.g. the prediction endpoint's audio uploads (:mod:`labswarm.serve`).
    """

    def __init__(self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES,
                 routes: Mapping[str, tuple[int, str]] | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.routes = [(re.compile(pattern), limit) for pattern, limit in (routes or {}).items()]

    def _limit(self, path: str) -> tuple[int, str]:
        """The largest body of a request to ``path``, and the setting that says so."""
        for pattern, limit in self.routes:
            if pattern.fullmatch(path):
                return limit
        return self.max_bytes, "max_body_bytes"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        max_bytes, setting = self._limit(scope.get("path", ""))
        declared = _content_length(scope)
        if declared is not None and declared > max_bytes:
            await _refuse(send, too_large(max_bytes, setting))
            return
        received, started, refused = 0, False, False
        reads_body = scope.get("method") not in NO_BODY_METHODS

        async def counted() -> Message:
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > max_bytes:
                    if reads_body:  # raised where the route reads its body: the app's handlers answer 413
                        raise HTTPException(413, too_large(max_bytes, setting))
                    if started:  # the route answers without it: the rest is dropped as it arrives
                        return {**message, "body": b""}
                    refused = True  # a stream's listener reads it: the 413 is sent here, the app sees the end
                    await _refuse(send, too_large(max_bytes, setting))
                    return {"type": "http.disconnect"}
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            if refused:  # the 413 went instead of the app's answer
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, counted, watched)


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
