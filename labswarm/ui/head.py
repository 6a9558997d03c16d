"""``HEAD`` answered wherever ``GET`` is (RFC 9110, 9.3.2: the same status and headers, no content): FastAPI's
routes answer only the methods they name, so a ``HEAD /ui/`` (a link checker, ``curl -I``, a load balancer's
probe) was a 405. :class:`HeadAsGet` runs a ``HEAD`` request as a ``GET`` and drops the content it produces."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class HeadAsGet:
    """ASGI middleware: a ``HEAD`` request runs as ``GET`` (the scope copied, the server's own untouched), its
    answer's status and headers (``Content-Length`` included) sent, each body chunk emptied.

    Args:
        app: the application to wrap.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def without_content(message: Message) -> None:
            if message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, without_content)
