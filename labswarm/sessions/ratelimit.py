"""A token bucket: the publish rate of a session, changeable while it runs."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class TokenBucket:
    """Allows ``rate`` acquisitions per second on average, with bursts of at most ``burst``.

    Args:
        rate: tokens per second (> 0).
        burst: bucket capacity; default ``max(1, rate / 10)`` (a tenth of a second of tokens), so a rate
            change takes effect within ~0.1 s.
        clock: monotonic clock in seconds (tests).
    """

    def __init__(self, rate: float, burst: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._fixed_burst = burst
        self._tokens = 0.0
        self._last = clock()
        self.set_rate(rate)

    @property
    def rate(self) -> float:
        """Tokens per second."""
        return self._rate

    def set_rate(self, rate: float) -> None:
        """Change the rate now (tokens accrued so far are kept, up to the new capacity).

        Raises:
            ValueError: ``rate`` is not positive.
        """
        if not rate > 0:
            raise ValueError(f"rate must be > 0 tasks/s, got {rate}")
        with self._lock:
            self._refill()
            self._rate = float(rate)
            self._burst = self._fixed_burst or max(1.0, self._rate / 10)
            self._tokens = min(self._tokens, self._burst)

    def _refill(self) -> None:
        now = self._clock()
        if hasattr(self, "_rate"):
            self._tokens = min(self._burst, self._tokens + (now - self._last) * self._rate)
        self._last = now

    def try_acquire(self) -> float:
        """Take a token if one is there: returns 0.0, else the seconds until one will be."""
        with self._lock:
            self._refill()
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return 0.0
            return (1.0 - self._tokens) / self._rate

    def acquire(self, stop: threading.Event | None = None, max_wait: float = 0.1) -> bool:
        """Block until a token is taken (``True``) or ``stop`` is set (``False``); re-checks every ``max_wait`` s."""
        while True:
            wait = self.try_acquire()
            if wait == 0.0:
                return True
            if stop is not None:
                if stop.wait(min(wait, max_wait)):
                    return False
            else:
                time.sleep(min(wait, max_wait))
