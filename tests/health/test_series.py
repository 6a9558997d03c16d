from __future__ import annotations

import math

from labswarm.timeseries import TimeSeries


def test_bounded_and_ordered() -> None:
    s = TimeSeries(maxlen=3)
    for t in range(5):
        s.append(t, t * 10)
    assert len(s) == 3 and [p[0] for p in s] == [2, 3, 4]
    s.append(1, 99)  # older than the last point: ignored
    assert s.last() == 40


def test_rate_and_mean() -> None:
    s = TimeSeries()
    assert math.isnan(s.rate(5)) and math.isnan(s.mean(5)) and math.isnan(s.last())
    for t in range(11):
        s.append(t, 3.0 * t)  # a counter growing 3/s
    assert s.rate(5) == 3.0
    assert s.rate(0.5) == 3.0  # window shorter than the spacing: the last two points
    assert s.mean(2) == (24 + 27 + 30) / 3
