"""A warm shutdown wakes the worker's event loop (issue 27: a worker told to stop went on polling until its next
timer, ~1-2 s of every ``labswarm run``'s end): the consumer's real kombu hub watches the worker's pipe, and
Celery's ``worker_shutting_down`` signal makes it readable."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
from kombu.asynchronous import Hub

from labswarm.queue import worker


def test_a_warm_shutdown_wakes_the_event_loop() -> None:
    hub = Hub()
    worker._wake.clear()
    read = None
    try:
        worker._watch_wake(sender=SimpleNamespace(hub=hub))
        assert len(worker._wake) == 1 and len(hub.readers) == 1
        (read,) = hub.readers
        worker._watch_wake(sender=SimpleNamespace(hub=hub))  # a second ready (a reconnection): one pipe
        assert len(worker._wake) == 1
        worker._wake_on_shutdown(sig="TERM", how="Warm", exitcode=0)
        loop = hub.create_loop()
        next(loop)  # one pass of the loop: the pipe was readable, its reader drained it
        with pytest.raises(BlockingIOError):
            os.read(read, 1)
        worker._watch_wake(sender=SimpleNamespace(hub=None))  # a polling transport: nothing to watch, no error
    finally:
        for fd in [*worker._wake, *([read] if read is not None else [])]:
            os.close(fd)
        worker._wake.clear()
        hub.close()
