"""A session's live event stream, ``GET /sessions/{id}/events`` (Server-Sent Events; mounted by the manager).

Every ``interval`` seconds (1 s by default) one ``progress`` event: the session's progress as
``GET /sessions/{id}`` shows it (:meth:`SessionService.progress`), plus ``time`` (Unix time in s, when it was read),
``depth`` (samples published without an outcome yet: in the queue or in a worker's hands, from the ledger's
counters) and ``publish_rate`` / ``consume_rate`` (samples/s: the slopes of ``published`` and ``finished`` over
the last :data:`RATE_WINDOW_S` seconds of this stream, ``null`` until it has two snapshots). Each event's id is
its number in the stream; a client reconnecting with ``Last-Event-ID`` gets the next numbers (snapshots are not
history: what it missed is not replayed; a ``Last-Event-ID`` that is not a number is a 400). When the session has
ended, the stream sends its last snapshot and an ``end`` event, and closes; a reconnection then (with
``Last-Event-ID``) is a 204, on which a browser's ``EventSource`` stops. An idle stream needs no keep-alive: a
snapshot is sent every interval.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.encoders import jsonable_encoder
from fastapi.responses import StreamingResponse

from labswarm import sse
from labswarm.errors import NotFound
from labswarm.sessions.api import Caller, Service, scope
from labswarm.sessions.models import ACTIVE
from labswarm.timeseries import TimeSeries

#: Seconds of snapshots the publish and consume rates are measured over.
RATE_WINDOW_S = 5.0
#: Seconds between two snapshots by default, and the bounds of ``interval``.
INTERVAL_S, MIN_INTERVAL_S, MAX_INTERVAL_S = 1.0, 0.2, 60.0


def snapshot(progress: dict[str, Any], published: TimeSeries, finished: TimeSeries, now: float) -> dict[str, Any]:
    """One ``progress`` event's data: ``progress`` with ``time``, ``depth`` and the rates (see the module).

    Args:
        progress: the session's progress (:meth:`SessionService.progress`).
        published: this stream's series of the ``published`` counter (the point for ``now`` is appended).
        finished: the same for ``finished`` (done + cached + failed).
        now: Unix time in s of the reading.
    """
    published.append(now, progress["published"])
    finished.append(now, progress["finished"])
    publish, consume = published.rate(RATE_WINDOW_S), finished.rate(RATE_WINDOW_S)
    return {**progress, "time": now, "depth": progress["pending"],
            "publish_rate": None if math.isnan(publish) else publish,
            "consume_rate": None if math.isnan(consume) else consume}


#: The route ``GET /sessions/{session_id}/events`` of the app's session service (authenticated by the app).
router = APIRouter(tags=["sessions"])


@router.get("/sessions/{session_id}/events", response_model=None)
async def session_events(
    session_id: str, request: Request, user: Caller, service: Service,
    interval: Annotated[float, Query(ge=MIN_INTERVAL_S, le=MAX_INTERVAL_S, description="s between snapshots")]
    = INTERVAL_S,
    last_id: Annotated[int | None, Depends(sse.last_event_id)] = None,
) -> Response:
    """Server-Sent Events: a ``progress`` snapshot of the session every ``interval`` s (queue depth, publish
    and consume rates in samples/s, counts), numbered; ``end`` once the session has ended. A reconnection
    (``Last-Event-ID``) to an ended session is a 204 (``EventSource`` stops; ``GET /sessions/{id}`` has the
    final counts); a ``Last-Event-ID`` that is not a number a 400; another user's session a 404."""
    await run_in_threadpool(service.session, session_id, scope(user))
    first = await run_in_threadpool(service.progress, session_id)  # 404 before the stream starts
    if last_id is not None and first["status"] not in ACTIVE:
        return sse.finished()
    number = last_id or 0

    async def stream() -> AsyncIterator[str]:
        nonlocal number
        published, finished = TimeSeries(maxlen=64), TimeSeries(maxlen=64)
        progress = first
        while True:
            number += 1
            yield sse.event(number, "progress", jsonable_encoder(snapshot(progress, published, finished,
                                                                          time.time())))
            if progress["status"] not in ACTIVE:
                number += 1
                yield sse.event(number, "end", {"status": progress["status"]})
                return
            await asyncio.sleep(interval)
            if await request.is_disconnected():
                return
            try:
                progress = await run_in_threadpool(service.progress, session_id)
            except NotFound:
                return

    return StreamingResponse(stream(), media_type=sse.MEDIA_TYPE, headers=sse.HEADERS)
