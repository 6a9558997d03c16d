"""A session's history: its depth and rates as a time series kept in the manager's database (issue 27, item 5).

The manager's :class:`HistoryRecorder` reads every active session once every :data:`INTERVAL_S` seconds (the
session's row: its counters, no ledger scan) and writes a point (:class:`~labswarm.sessions.models.SeriesPointRow`)
when the session's current *step* has passed since its last point. Every session's history starts with an origin
point at ``started_at`` (every counter is 0 when a session starts) and ends with a point at ``finished_at``, written
when the recorder sees the session ended, so a figure spans the session's whole duration. (A session that starts
and ends between two readings has no stored point: :func:`series_body` gives its start and its end.)

Bound (the downsampling rule): a session keeps at most :data:`MAX_POINTS` points however long it runs. Its step
is ``INTERVAL_S x 2**k`` for the smallest ``k >= 0`` with ``age / step <= MAX_POINTS / 2`` (``age``: seconds since
it started; :func:`step_for`): one point a second for its first ~17 minutes, one every 2 s up to ~33 minutes, ...,
one every 128 s for a day. Each time its step doubles (and whenever a write would take it over
:data:`MAX_POINTS`), its stored points are thinned to the new step (:func:`thin`: walking them in time order, a
point is kept when it is at least one step after the last kept one; the first and the last are always kept),
which leaves about ``MAX_POINTS / 2``, one to two steps apart: the history is evenly spaced over the session's
whole life, never just its last hour.

Rates: a point's ``publish_rate`` and ``consume_rate`` are the slopes of the ``published`` and ``finished``
counters over the last ``max(RATE_WINDOW_S, gap to the previous point)`` seconds: the last 5 s (as the event
stream's) while points are 1 s apart, and the mean over the whole gap once they are further apart (recomputed for
the points a thinning keeps), so a downsampled series still integrates to the counts. ``asked_rate`` is the publish
rate in force (tasks/s; 0 while the session is paused).
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from labswarm.sessions.models import SeriesPointRow, SessionRow
from labswarm.sessions.states import ACTIVE, SessionState
from labswarm.timeseries import TimeSeries

log = logging.getLogger(__name__)

#: Seconds between two readings of the active sessions, and the finest step of a history.
INTERVAL_S = 1.0
#: The most points one session's history keeps (see the module: the downsampling rule).
MAX_POINTS = 2000
#: Seconds the rates of closely spaced points are measured over (the event stream's window too).
RATE_WINDOW_S = 5.0


def step_for(age_s: float, interval: float = INTERVAL_S, max_points: int = MAX_POINTS) -> float:
    """The step of a session ``age_s`` seconds old: ``interval x 2**k``, the smallest ``k >= 0`` with
    ``age_s / step <= max_points / 2`` (seconds)."""
    half = max(1, max_points // 2)
    if age_s <= interval * half:
        return interval
    return interval * 2.0 ** math.ceil(math.log2(age_s / (interval * half)))


def thin(times: list[float], step: float) -> list[int]:
    """Indices of the points of ``times`` (increasing, s) kept at ``step``: the first, each one at least ``step``
    after the last kept (1 % tolerance, so a clock's jitter keeps a point on the grid), and the last."""
    if not times:
        return []
    kept = [0]
    for i in range(1, len(times) - 1):
        if times[i] - times[kept[-1]] >= 0.99 * step:
            kept.append(i)
    if len(times) > 1:
        kept.append(len(times) - 1)
    return kept


def unix(value: datetime) -> float:
    """A database datetime (naive: UTC) as Unix time in s."""
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()


def _slope(v1: float, v0: float, t1: float, t0: float) -> float | None:
    return (v1 - v0) / (t1 - t0) if t1 > t0 else None


@dataclass
class _Track:
    """What the recorder remembers of one session: its recent readings and its last stored point."""

    start: float  # Unix s of the session's start
    count: int  # points stored
    last: tuple[float, int, int] | None  # (time, published, finished) of the last stored point
    published: TimeSeries = field(default_factory=lambda: TimeSeries(maxlen=64))
    finished: TimeSeries = field(default_factory=lambda: TimeSeries(maxlen=64))
    ended: bool = False
    thinned: float | None = None  # the step its stored points are at (None: unknown, after a manager restart)


def point(track: _Track, progress: dict[str, Any], now: float) -> dict[str, Any]:
    """The point of ``progress`` read at ``now`` (Unix s), its rates as the module says; ``track``'s readings
    gain this one."""
    track.published.append(now, progress["published"])
    track.finished.append(now, progress["finished"])
    publish: float | None
    consume: float | None
    if track.last is not None and now - track.last[0] > RATE_WINDOW_S:
        t0, p0, f0 = track.last
        publish = _slope(progress["published"], p0, now, t0)
        consume = _slope(progress["finished"], f0, now, t0)
    else:
        publish, consume = track.published.rate(RATE_WINDOW_S), track.finished.rate(RATE_WINDOW_S)
        publish, consume = (None if math.isnan(publish) else publish), (None if math.isnan(consume) else consume)
    running = progress["status"] == SessionState.RUNNING
    return {"time": now, "depth": progress["pending"], "published": progress["published"],
            "finished": progress["finished"], "publish_rate": publish, "consume_rate": consume,
            "asked_rate": float(progress["rate"]) if running else 0.0}


def read(db: Session, session_id: str) -> list[dict[str, Any]]:
    """A session's stored history, oldest first: dicts of :class:`~labswarm.sessions.models.SeriesPointRow`'s
    columns (``time``, ``depth``, ``published``, ``finished``, ``publish_rate``, ``consume_rate``,
    ``asked_rate``); at most :data:`MAX_POINTS`; empty for a session that ended before histories were kept."""
    rows = db.scalars(select(SeriesPointRow).where(SeriesPointRow.session_id == session_id)
                      .order_by(SeriesPointRow.time, SeriesPointRow.id))
    return [{"time": r.time, "depth": r.depth, "published": r.published, "finished": r.finished,
             "publish_rate": r.publish_rate, "consume_rate": r.consume_rate, "asked_rate": r.asked_rate}
            for r in rows]


def thin_stored(db: Session, session_id: str, step: float) -> int:
    """Thin a session's stored points to ``step`` (:func:`thin`) and recompute the rates of the kept points that
    are now more than :data:`RATE_WINDOW_S` apart (see the module). Not committed.

    Returns:
        The points kept.
    """
    rows = list(db.scalars(select(SeriesPointRow).where(SeriesPointRow.session_id == session_id)
                           .order_by(SeriesPointRow.time, SeriesPointRow.id)))
    kept = thin([r.time for r in rows], step)
    keep = set(kept)
    dropped = [r.id for i, r in enumerate(rows) if i not in keep]
    for start in range(0, len(dropped), 500):
        db.execute(delete(SeriesPointRow).where(SeriesPointRow.id.in_(dropped[start:start + 500])))
    for before, after in itertools.pairwise(kept):
        a, b = rows[before], rows[after]
        if b.time - a.time > RATE_WINDOW_S:
            db.execute(update(SeriesPointRow).where(SeriesPointRow.id == b.id).values(
                publish_rate=_slope(b.published, a.published, b.time, a.time),
                consume_rate=_slope(b.finished, a.finished, b.time, a.time)))
    return len(kept)


class HistoryRecorder(threading.Thread):
    """The manager's thread that keeps every session's history (see the module).

    Args:
        db: a factory of database sessions (the service's ``db``).
        progress_of: a session row -> its progress (:meth:`SessionService.progress_of`: counters, status, rate in
            force).
        interval: seconds between two readings (:data:`INTERVAL_S`).
        max_points: the bound of a history (:data:`MAX_POINTS`).
        clock: Unix time in s (tests).
    """

    def __init__(self, db: Callable[[], AbstractContextManager[Session]],
                 progress_of: Callable[[SessionRow], dict[str, Any]], interval: float = INTERVAL_S,
                 max_points: int = MAX_POINTS, clock: Callable[[], float] = time.time) -> None:
        super().__init__(name="session-history", daemon=True)
        self._db, self._progress_of = db, progress_of
        self.interval, self.max_points, self._clock = interval, max_points, clock
        self._tracks: dict[str, _Track] = {}
        self._halt = threading.Event()

    def begin(self) -> None:
        """Start the thread unless it was started already (a second call changes nothing)."""
        if self.ident is None:
            self.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread (its sessions' histories stay; a next manager continues them)."""
        self._halt.set()
        if self.is_alive():
            self.join(timeout)

    def run(self) -> None:
        while not self._halt.wait(self.interval):
            try:
                self.tick()
            except Exception:  # a database hiccup: the next reading retries; never the end of the histories
                log.exception("session history: reading failed")

    def tick(self) -> None:
        """Read the active sessions (one indexed query) and those seen active before that have ended (by id, to
        write their last point) once; write the points that are due."""
        now = self._clock()
        with self._db() as db:
            rows = list(db.scalars(select(SessionRow).where(SessionRow.status.in_([s.value for s in ACTIVE]))))
            active = {row.id for row in rows}
            rows += [row for sid in list(self._tracks) if sid not in active
                     and (row := db.get(SessionRow, sid)) is not None]
        readings = [(row, self._progress_of(row)) for row in rows]  # before this reading's transaction
        try:
            with self._db() as db:
                for row, progress in readings:
                    self._record(db, row, progress, now)
                db.commit()
        except Exception:
            self._tracks.clear()  # what they remember may not be stored: read again from the database next time
            raise
        listed = {row.id for row in rows}
        for gone in [sid for sid, track in self._tracks.items() if sid not in listed or track.ended]:
            del self._tracks[gone]

    def _track(self, db: Session, row: SessionRow) -> _Track:
        """The session's track, from its stored points on first sight; its origin point written when it has
        none."""
        track = self._tracks.get(row.id)
        if track is not None:
            return track
        start = unix(row.started_at or row.created_at)
        count = db.scalar(select(func.count()).select_from(SeriesPointRow)
                          .where(SeriesPointRow.session_id == row.id)) or 0
        last = db.execute(select(SeriesPointRow.time, SeriesPointRow.published, SeriesPointRow.finished)
                          .where(SeriesPointRow.session_id == row.id)
                          .order_by(SeriesPointRow.time.desc()).limit(1)).first()
        track = _Track(start=start, count=int(count), last=tuple(last) if last else None)  # type: ignore[arg-type]
        if last is None:
            db.add(SeriesPointRow(session_id=row.id, time=start, depth=0, published=0, finished=0,
                                  publish_rate=None, consume_rate=None, asked_rate=row.rate))
            track.count, track.last, track.thinned = 1, (start, 0, 0), self.interval
        track.ended = row.finished_at is not None and track.last is not None and \
            track.last[0] >= unix(row.finished_at) - 1e-3
        self._tracks[row.id] = track
        return track

    def _record(self, db: Session, row: SessionRow, progress: dict[str, Any], now: float) -> None:
        """Add the session's point to ``db`` when one is due (not committed)."""
        track = self._track(db, row)
        ended = row.status not in ACTIVE
        if track.ended:
            return
        at = unix(row.finished_at) if ended and row.finished_at is not None else now
        at = max(at, track.last[0] if track.last else at)
        step = step_for(at - track.start, self.interval, self.max_points)
        due = track.last is None or at - track.last[0] >= 0.99 * step
        p = point(track, progress, at)
        if due or ended:
            db.add(SeriesPointRow(session_id=row.id, **p))
            track.count += 1
            track.last = (at, p["published"], p["finished"])
            track.ended = ended
            if track.count > self.max_points or track.thinned is None or step > track.thinned:
                db.flush()
                track.count, track.thinned = thin_stored(db, row.id, step), step


def series_body(row: SessionRow, points: list[dict[str, Any]], now: float) -> dict[str, Any]:
    """``GET /sessions/{id}/series``'s body: the session's id and status, its current ``step_s`` (s between
    points now), ``max_points``, ``rate_window_s``, its start and end (Unix s; ``end`` ``None`` while active)
    and its ``points`` (:func:`read`). A session with no stored point (one that ended before histories were
    kept) gets its origin point and, once ended, a point at its end with its final counters and its mean rates."""
    start = unix(row.started_at or row.created_at)
    end = unix(row.finished_at) if row.finished_at is not None else None
    if not points:  # a session older than histories (revision 0008), or not read yet: its start and its end
        points = [{"time": start, "depth": 0, "published": 0, "finished": 0, "publish_rate": None,
                   "consume_rate": None, "asked_rate": row.rate}]
        if end is not None and end > start:
            finished = row.done + row.cached + row.failed
            points.append({"time": end, "depth": row.pending, "published": row.published, "finished": finished,
                           "publish_rate": row.published / (end - start), "consume_rate": finished / (end - start),
                           "asked_rate": 0.0})
    return {"session": row.id, "status": row.status, "start": start, "end": end,
            "step_s": step_for((end or now) - start), "max_points": MAX_POINTS, "rate_window_s": RATE_WINDOW_S,
            "interval_s": INTERVAL_S, "points": points}


__all__ = ["INTERVAL_S", "MAX_POINTS", "RATE_WINDOW_S", "HistoryRecorder", "point", "read",
           "series_body", "step_for", "thin", "thin_stored"]
