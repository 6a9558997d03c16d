"""Server-Sent Events as the standard has them (WHATWG HTML, "Server-sent events"), for the manager's streams
(``/v1/jobs/{id}/events``, ``/sessions/{id}/events``).

- An event is ``id``, ``event`` and one ``data`` line of strict JSON (:mod:`labswarm.strictjson`: no ``NaN``).
- ``Last-Event-ID`` is a decimal event number (at most :data:`MAX_EVENT_ID`); an empty one is no header (the
  standard's reset); anything else is a 400, never a silent replay from the start.
- A stream with nothing more to send, ever (a finished job or session), answers ``204 No Content``: that is the
  one answer on which a browser's ``EventSource`` stops reconnecting (:func:`finished`).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import Header, HTTPException, Response

from labswarm.strictjson import dumps

#: The media type of an event stream.
MEDIA_TYPE = "text/event-stream"
#: Headers of every stream: no caching, no buffering in a reverse proxy (nginx's ``X-Accel-Buffering``).
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
#: The largest event number a ``Last-Event-ID`` may carry (a signed 64-bit integer, as the database stores it).
MAX_EVENT_ID = 2**63 - 1
_DIGITS = re.compile(r"[0-9]{1,19}")


def event(number: int, kind: str, data: Any) -> str:
    """One event: ``id: number``, ``event: kind``, ``data:`` the strict JSON of ``data``, and the blank line."""
    return f"id: {number}\nevent: {kind}\ndata: {dumps(data)}\n\n"


def parse_last_event_id(value: str | None) -> int | None:
    """The event number of a ``Last-Event-ID`` header: ``None`` when absent or empty.

    Raises:
        HTTPException: 400 for anything but a decimal number from 0 to :data:`MAX_EVENT_ID`.
    """
    if value is None or not value.strip():
        return None
    value = value.strip()
    if not _DIGITS.fullmatch(value) or int(value) > MAX_EVENT_ID:
        raise HTTPException(400, f"Last-Event-ID must be an event number (0 to {MAX_EVENT_ID}), got {value[:40]!r}")
    return int(value)


async def last_event_id(
    last_event_id: Annotated[str | None, Header(description="the number of the last event received: the stream "
                                                "resumes after it (400 when not a number)")] = None,
) -> int | None:
    """Route dependency: the request's ``Last-Event-ID`` as a number (:func:`parse_last_event_id`)."""
    return parse_last_event_id(last_event_id)


def finished() -> Response:
    """The answer of a stream that has nothing more to send: ``204 No Content`` (``EventSource`` stops)."""
    return Response(status_code=204, headers={"Cache-Control": "no-cache"})
