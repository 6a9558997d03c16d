"""A session's live event stream, ``GET /sessions/{id}/events`` (Server-Sent Events), and its history,
``GET /sessions/{id}/series`` (mounted by the manager).

A new stream (no ``Last-Event-ID``) starts with one ``series`` event: the session's history as
``GET /sessions/{id}/series`` has it (:mod:`labswarm.sessions.history`: at most 2,000 points, downsampled for
long sessions), so a page opened late or reloaded draws the session from its start. Then every ``interval``
seconds (1 s by default) one ``progress`` event: the session's progress as ``GET /sessions/{id}`` shows it
(:meth:`SessionService.progress`), plus ``time`` (Unix time in s, when it was read), ``depth`` (samples
published without an outcome yet: in the queue or in a worker's hands, from the ledger's counters) and
``publish_rate`` / ``consume_rate`` (samples/s: the slopes of ``published`` and ``finished`` over the last
:data:`RATE_WINDOW_S` seconds of this stream, ``null`` until it has two snapshots). Each event's id is its
number in the stream; a client reconnecting with ``Last-Event-ID`` gets the next numbers and no ``series``
(what it missed is not replayed; a ``Last-Event-ID`` that is not a number is a 400). When the session has ended,
the stream sends its last snapshot (its ``time``: the session's end, not the time of reading) and an ``end``
event, and closes; a reconnection then (with ``Last-Event-ID``) is a 204, on which a browser's ``EventSource``
stops. An idle stream needs no keep-alive: a snapshot is sent every interval.
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
from pydantic import BaseModel, Field

from labswarm import sse
from labswarm.errors import NotFound
from labswarm.sessions import history
from labswarm.sessions.api import Caller, Service, scope
from labswarm.sessions.models import ACTIVE
from labswarm.sessions.service import SessionService
from labswarm.timeseries import TimeSeries

#: Seconds of snapshots the publish and consume rates are measured over (the history's too).
RATE_WINDOW_S = history.RATE_WINDOW_S
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
    """Server-Sent Events: first (unless resuming) the session's history (``series``, as
    ``GET /sessions/{id}/series``), then a ``progress`` snapshot of the session every ``interval`` s (queue
    depth, publish and consume rates in samples/s over the last 5 s, counts), numbered; ``end`` once the
    session has ended. A reconnection (``Last-Event-ID``) to an ended session is a 204 (``EventSource`` stops;
    ``GET /sessions/{id}`` has the final counts); a ``Last-Event-ID`` that is not a number a 400; another
    user's session a 404."""
    await run_in_threadpool(service.session, session_id, scope(user))
    first = await run_in_threadpool(service.progress, session_id)  # 404 before the stream starts
    if last_id is not None and first["status"] not in ACTIVE:
        return sse.finished()
    number = last_id or 0
    past = None if last_id is not None else await run_in_threadpool(_series, service, session_id, None)

    async def stream() -> AsyncIterator[str]:
        nonlocal number
        published, finished = TimeSeries(maxlen=64), TimeSeries(maxlen=64)
        progress = first
        if past is not None:
            number += 1
            yield sse.event(number, "series", past)
        while True:
            number += 1
            ended = progress["status"] not in ACTIVE and progress["finished_at"] is not None
            now = history.unix(progress["finished_at"]) if ended else time.time()
            yield sse.event(number, "progress", jsonable_encoder(snapshot(progress, published, finished, now)))
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


class SeriesPoint(BaseModel):
    """One point of a session's history (:mod:`labswarm.sessions.history`)."""

    time: float = Field(description="Unix time in s of the reading")
    depth: int = Field(description="samples published without an outcome yet (queued or in a worker's hands)")
    published: int = Field(description="samples published so far (counter)")
    finished: int = Field(description="samples with an outcome so far: done + cached + failed (counter)")
    publish_rate: float | None = Field(description="samples/s published over the last max(rate_window_s, gap to "
                                       "the previous point) s; null without an earlier reading")
    consume_rate: float | None = Field(description="samples/s finished over the same window")
    asked_rate: float | None = Field(description="the publish rate in force, tasks/s (0 while paused)")


class SessionSeries(BaseModel):
    """A session's history: its depth and rates over time, at most ``max_points`` points spanning its life."""

    session: str = Field(description="the session's id")
    status: str = Field(description="the session's status now")
    start: float = Field(description="Unix time in s the session started")
    end: float | None = Field(description="Unix time in s it ended; null while active")
    step_s: float = Field(description="s between two points now: interval_s x 2^k, doubled each time the "
                          "session's age passes max_points / 2 steps (older points are thinned to it)")
    interval_s: float = Field(description="s between two points while the session is young")
    max_points: int = Field(description="the most points a session keeps")
    rate_window_s: float = Field(description="s the rates of closely spaced points are measured over")
    points: list[SeriesPoint] = Field(description="oldest first; the first at the start, the last at the end "
                                      "once ended")


def _series(service: SessionService, session_id: str, owner: str | None) -> dict[str, Any]:
    """The session's history as ``GET /sessions/{id}/series`` answers it (JSON-ready).

    Raises:
        NotFound: no such session, or (``owner`` given) another user's.
    """
    row = service.session(session_id, owner)
    with service.db() as db:
        points = history.read(db, row.id)
    return jsonable_encoder(history.series_body(row, points, time.time()))


@router.get("/sessions/{session_id}/series", response_model=SessionSeries)
def session_series(session_id: str, user: Caller, service: Service) -> dict[str, Any]:
    """A session's history kept by the manager: queue depth, publish, consume and asked rates over its whole
    life, downsampled for long sessions (at most ``max_points`` evenly spaced points: one a second while the
    session is young, the step doubling as it ages). Live or ended; another user's session is a 404."""
    return _series(service, session_id, scope(user))
