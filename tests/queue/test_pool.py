"""The worker's pool (:mod:`labswarm.queue.pool`): its warm stop ends the timer thread of Celery's prefork stop as
soon as the pool's join has returned, instead of after that thread's sleep (issue 27: ~0.5 s of every worker's
stop). Celery's own ``on_stop`` runs, with a real kombu hub; the pool it joins is a stand-in that returns at
once (an idle pool's join). The sleep here waits up to 60 s: Celery's stock pool would leave the thread asleep
past its 1-s join and log that it did not end cleanly."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from billiard.pool import CLOSE, RUN
from celery.concurrency import prefork
from kombu.asynchronous import Hub, set_event_loop

from labswarm.queue import pool as pool_module
from labswarm.queue.worker import POOL


class _IdlePool:
    """What on_stop uses of billiard's pool: its state, close() and a join() that returns at once."""

    def __init__(self) -> None:
        self._state = RUN
        self.joined = False

    def close(self) -> None:
        self._state = CLOSE

    def join(self) -> None:
        self.joined = True


class _LongSleep(pool_module._StopClock):
    """The stop clock with a 60-s sleep: only the join's wake ends it in time."""

    def sleep(self, seconds: float) -> None:
        self.joined.wait(60.0)


class _Pool(pool_module.TaskPool):
    clock = _LongSleep


def test_the_warm_stop_ends_the_timer_thread_when_the_join_returns(monkeypatch: pytest.MonkeyPatch,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """Two pools stopped one after the other in this process: each stop's own clock ends its thread, and Celery's
    module has :mod:`time` back after each (a clock left there, its event set, would spin a later stop's
    thread)."""
    assert f"{pool_module.__name__}:{pool_module.TaskPool.__name__}" == POOL  # what run_worker selects
    monkeypatch.setattr(prefork, "time", time)  # put back after the test whatever happens
    hub = Hub()
    set_event_loop(hub)
    try:
        for _ in range(2):
            task_pool = _Pool(limit=1)
            idle = task_pool._pool = _IdlePool()
            with caplog.at_level(logging.WARNING, logger="celery"):
                task_pool.on_stop()
            assert idle.joined and task_pool._pool is None
            assert not [t for t in threading.enumerate() if t.name == "prefork-timer-shutdown"]
            assert "did not terminate cleanly" not in caplog.text
            assert prefork.time is time
    finally:
        set_event_loop(None)
        hub.close()
