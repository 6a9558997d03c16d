"""The worker's pool: Celery's prefork pool, stopped without its timer thread's last half second.

Celery 5.7's prefork pool, at a warm shutdown (``TaskPool.on_stop``), keeps the event loop's timers firing from a
thread (``prefork-timer-shutdown``) while it joins its pool processes: the thread fires the timers, then sleeps
0.5 s (``time.sleep(0.5)``), until the join is over; then the pool waits for the thread (``join(timeout=1.0)``).
An idle worker's pool joins in a few milliseconds, so its stop waited for that sleep: ~0.5 s of every worker's
warm shutdown (a worker's Celery debug log: ``Worker: Stopping Pool...`` 0.50 s before ``Stopping Hub``), the
last half second of every ``labswarm run``, whose end waits for its workers (issue 27).

:class:`TaskPool` is Celery's, its stop unchanged but for that sleep: the thread's sleep (its module's
``time.sleep``, its only use of ``time``) is, for the stop's duration, a wait that ends as soon as that pool's
join has returned, so the thread ends at once and the stop goes on. While the join lasts (tasks still running at
a warm shutdown) the thread fires the timers every 0.5 s as before. The worker selects it with Celery's
``worker_pool`` setting (:func:`~labswarm.queue.worker.run_worker`).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from celery.concurrency import prefork


class _StopClock:
    """Stands for the ``time`` module in :mod:`celery.concurrency.prefork`: ``sleep`` waits until the pool's join
    has returned (at most the seconds asked), everything else is :mod:`time`'s."""

    def __init__(self) -> None:
        self.joined = threading.Event()

    def sleep(self, seconds: float) -> None:
        self.joined.wait(seconds)

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


class TaskPool(prefork.TaskPool):
    """Celery's prefork pool whose warm stop does not wait for its timer thread's sleep (see the module).

    Each stop has a clock of its own (:attr:`clock`, a fresh event), in :mod:`celery.concurrency.prefork` only for
    the stop's duration: the module's ``time`` is :mod:`time` again once the stop has returned, so a later stop
    (of this pool class or Celery's own) sleeps its 0.5 s and does not find an event already set (which would
    make its timer thread fire the timers without a pause). Two pools stopping at once in one process (not a
    worker's case: one pool a worker process) share the later stop's clock: once the later pool's join has returned,
    the earlier stop's timer thread fires its timers without a pause until the later stop has ended (milliseconds),
    and sleeps Celery's 0.5 s after that."""

    #: The stop's clock, one per stop (a class, so that a test can make its sleep longer).
    clock: type[_StopClock] = _StopClock

    def on_stop(self) -> None:
        pool = self._pool
        if pool is None:
            super().on_stop()
            return
        clock = self.clock()
        join = pool.join

        def join_then_wake() -> None:
            try:
                join()
            finally:
                clock.joined.set()  # the timer thread's sleep ends: Celery then stops and joins it

        pool.join = join_then_wake
        prefork.time = clock  # its one use: the timer thread's sleep
        try:
            super().on_stop()
        finally:
            if prefork.time is clock:  # not another stop's, begun meanwhile
                prefork.time = time
