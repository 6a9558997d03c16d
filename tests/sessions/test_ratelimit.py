"""The token bucket that paces a session's publishing, on a fake clock."""

from __future__ import annotations

import threading

import pytest

from labswarm.sessions.ratelimit import TokenBucket


class FakeClock:
    """A monotonic clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def _drain(bucket: TokenBucket) -> int:
    taken = 0
    while bucket.try_acquire() == 0.0:
        taken += 1
    return taken


def _taken_over(bucket: TokenBucket, clock: FakeClock, seconds: float, step: float = 0.01) -> int:
    """Tokens taken by a greedy caller polling every ``step`` s for ``seconds`` s."""
    taken = 0
    for _ in range(round(seconds / step)):
        clock.advance(step)
        taken += _drain(bucket)
    return taken


def test_average_rate() -> None:
    clock = FakeClock()
    bucket = TokenBucket(50.0, clock=clock)
    assert bucket.rate == 50.0
    assert _drain(bucket) == 0  # starts empty: no burst at start-up
    assert _taken_over(bucket, clock, 10.0) == pytest.approx(500, abs=6)


def test_wait_hint_is_the_time_to_the_next_token() -> None:
    clock = FakeClock()
    bucket = TokenBucket(4.0, clock=clock)
    assert bucket.try_acquire() == pytest.approx(0.25)
    clock.advance(0.1)
    assert bucket.try_acquire() == pytest.approx(0.15)
    clock.advance(0.15)
    assert bucket.try_acquire() == 0.0


def test_burst_is_capped_after_idling() -> None:
    clock = FakeClock()
    bucket = TokenBucket(100.0, clock=clock)
    clock.advance(60.0)  # a minute idle does not bank 6,000 tokens
    assert _drain(bucket) == 10  # default burst: a tenth of a second of tokens
    fixed = TokenBucket(100.0, burst=3, clock=clock)
    clock.advance(60.0)
    assert _drain(fixed) == 3
    slow = TokenBucket(0.5, clock=clock)
    clock.advance(60.0)
    assert _drain(slow) == 1  # at least one token


def test_live_rate_change() -> None:
    clock = FakeClock()
    bucket = TokenBucket(10.0, clock=clock)
    assert _taken_over(bucket, clock, 2.0) == pytest.approx(20, abs=2)
    bucket.set_rate(100.0)
    assert bucket.rate == 100.0
    assert _taken_over(bucket, clock, 2.0) == pytest.approx(200, abs=3)
    clock.advance(5.0)
    bucket.set_rate(2.0)  # slowing down drops the banked burst to the new capacity at once
    assert _drain(bucket) == 1
    assert _taken_over(bucket, clock, 5.0) == pytest.approx(10, abs=1)


@pytest.mark.parametrize("rate", [0, -1.0, float("nan")])
def test_invalid_rate(rate: float) -> None:
    with pytest.raises(ValueError, match="rate must be > 0"):
        TokenBucket(rate)
    bucket = TokenBucket(1.0)
    with pytest.raises(ValueError, match="rate must be > 0"):
        bucket.set_rate(rate)
    assert bucket.rate == 1.0


def test_acquire_returns_false_once_stopped() -> None:
    bucket = TokenBucket(0.001)  # the next token is ~17 minutes away
    stop = threading.Event()
    stop.set()
    assert bucket.acquire(stop) is False
