"""Bounded time series: timestamped ring buffers of the monitored values."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator


class TimeSeries:
    """The last ``maxlen`` ``(t, value)`` points of one quantity, ``t`` in seconds, increasing.

    Args:
        maxlen: points kept; older ones are dropped (bounded memory however long the session).
    """

    def __init__(self, maxlen: int = 3600) -> None:
        self._points: deque[tuple[float, float]] = deque(maxlen=maxlen)

    def append(self, t: float, value: float) -> None:
        """Add a point; a point older than the last one is ignored (clocks never go back here)."""
        if self._points and t < self._points[-1][0]:
            return
        self._points.append((float(t), float(value)))

    def __len__(self) -> int:
        return len(self._points)

    def __iter__(self) -> Iterator[tuple[float, float]]:
        return iter(self._points)

    def last(self, default: float = math.nan) -> float:
        """The latest value, or ``default`` when empty."""
        return self._points[-1][1] if self._points else default

    def since(self, t: float) -> list[tuple[float, float]]:
        """The points at or after ``t``."""
        return [p for p in self._points if p[0] >= t]

    def mean(self, window: float) -> float:
        """Mean of the values of the last ``window`` seconds (NaN when none)."""
        if not self._points:
            return math.nan
        points = self.since(self._points[-1][0] - window)
        return sum(v for _, v in points) / len(points)

    def rate(self, window: float) -> float:
        """Slope of a counter over the last ``window`` seconds, per second (NaN with fewer than 2 points).

        For cumulative counts (published, finished) this is the publish or consume rate.
        """
        if len(self._points) < 2:
            return math.nan
        t1, v1 = self._points[-1]
        first = None
        for t, v in self._points:
            if t >= t1 - window:
                first = (t, v)
                break
        if first is None or first[0] == t1:
            t0, v0 = self._points[-2]
        else:
            t0, v0 = first
        return (v1 - v0) / (t1 - t0) if t1 > t0 else math.nan
