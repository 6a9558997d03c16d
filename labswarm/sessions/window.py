"""The start window: how many samples a session may have outstanding before anyone steers its rate.

A session's token bucket starts at the default rate (200 tasks/s), far above what a few workers consume, and the
health controller needs outcomes to measure anything. Until someone sets the rate, the publisher is therefore
held by a window on the samples *outstanding* (published, no outcome yet), as TCP holds a sender by its
congestion window before it knows the path (RFC 5681, slow start):

* it starts at ``size`` (``LABSWARM_START_WINDOW``), so a session whose workers have not started puts at most
  that many messages in its queue;
* every outcome opens it by one (slow start: the window doubles every task time while the workers keep up);
* it never opens past ``seconds`` of the consume rate it measures itself, plus what the workers hold
  (that rate times the slowest task seen), so that without a controller the queue still holds only a few
  seconds of work;
* the first rate set on the session (the health controller's first decision, or a user's ``PUT .../rate``)
  lifts it: from then on the token bucket alone governs.

Without a controller (``labswarm run --no-health``, a cluster without ``labswarm health``) the window is never
lifted: the publisher is self-clocked by its outcomes for the whole session, its queue bounded by about
``seconds`` of consumption. A manager restart starts a new window (the session's outstanding samples, read from
the ledger, count against it) until the next rate is set.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

#: Seconds of the measured consume rate the window may hold beyond what the workers hold.
WINDOW_SECONDS = 5.0


class StartWindow:
    """A window on outstanding samples, thread-safe (outcomes arrive on API threads, the publisher waits).

    Args:
        size: the initial window, samples (>= 1): ``LABSWARM_START_WINDOW``.
        outstanding: samples already outstanding (published by a previous manager process, no outcome yet).
        seconds: the ceiling's seconds of measured consume rate (``WINDOW_SECONDS``).
        clock: monotonic clock in seconds (tests).

    Raises:
        ValueError: ``size`` is below 1 or ``outstanding`` is negative.
    """

    def __init__(self, size: int, outstanding: int = 0, seconds: float = WINDOW_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if size < 1:
            raise ValueError(f"start_window must be >= 1 sample, got {size}")
        if outstanding < 0:
            raise ValueError(f"outstanding must be >= 0, got {outstanding}")
        self.size = int(size)
        self.seconds = seconds
        self._clock = clock
        self._cond = threading.Condition()
        self._window = float(size)
        self._outstanding = int(outstanding)
        self._lifted = False
        self._task_seconds = 0.0
        self._first_outcome: float | None = None
        self._outcomes: deque[tuple[float, int]] = deque()  # (time, outcomes) of the last `seconds`

    @property
    def lifted(self) -> bool:
        """``True`` once a rate was set: the window no longer holds the publisher."""
        return self._lifted

    @property
    def outstanding(self) -> int:
        """Samples published without an outcome, as this window counts them."""
        return self._outstanding

    @property
    def window(self) -> float:
        """The window now, samples."""
        return self._window

    def consume_rate(self) -> float:
        """Outcomes per second over the last ``seconds`` (0 before the first outcome)."""
        with self._cond:
            return self._rate(self._clock())

    def _rate(self, now: float) -> float:
        while self._outcomes and self._outcomes[0][0] < now - self.seconds:
            self._outcomes.popleft()
        if self._first_outcome is None:
            return 0.0
        span = max(1.0, min(self.seconds, now - self._first_outcome))
        return sum(n for _, n in self._outcomes) / span

    def ceiling(self) -> float:
        """The most the window opens to: ``max(size, rate x (slowest task s + seconds))``, samples."""
        with self._cond:
            return self._ceiling(self._clock())

    def _ceiling(self, now: float) -> float:
        return max(float(self.size), self._rate(now) * (self._task_seconds + self.seconds))

    def allowance(self) -> int | None:
        """Samples that may be published now (``None``: no limit, the window is lifted)."""
        with self._cond:
            if self._lifted:
                return None
            return max(0, int(self._window) - self._outstanding)

    def sent(self, n: int) -> None:
        """``n`` samples were published (confirmed)."""
        with self._cond:
            self._outstanding += n

    def outcomes(self, n: int, max_seconds: float = 0.0) -> None:
        """``n`` outcomes arrived (the slowest took ``max_seconds``): the window opens by ``n``, up to its ceiling."""
        if n <= 0:
            return
        with self._cond:
            now = self._clock()
            if self._first_outcome is None:
                self._first_outcome = now
            self._outcomes.append((now, n))
            self._task_seconds = max(self._task_seconds, max_seconds)
            self._outstanding = max(0, self._outstanding - n)
            self._window = max(float(self.size), min(self._window + n, self._ceiling(now)))
            self._cond.notify_all()

    def resync(self, outstanding: int) -> None:
        """Set the outstanding count from the ledger (duplicate outcomes make the in-memory count drift)."""
        with self._cond:
            self._outstanding = max(0, int(outstanding))
            self._cond.notify_all()

    def lift(self) -> None:
        """A rate was set: the window stops holding the publisher."""
        with self._cond:
            self._lifted = True
            self._cond.notify_all()

    def wait(self, timeout: float) -> None:
        """Block until outcomes arrive, the window is lifted or ``timeout`` seconds pass."""
        with self._cond:
            if not self._lifted:
                self._cond.wait(timeout)
