"""Queues of ended experiments are deleted (issue 28): RabbitMQ keeps a durable queue forever, and one per
experiment piles up.

The manager runs a :class:`QueueCleaner` (started with it, :mod:`labswarm.manager.queues`): every
``interval`` it asks which experiments have no active session (none running or paused) and since when their
last session ended; a queue whose experiment ended ``delay`` (``LABSWARM_QUEUE_DELETE_AFTER``, 1 h by default)
or more ago is deleted with ``queue.delete(if_empty, if_unused)``: RabbitMQ itself refuses to delete a queue that
holds a message or has a consumer (a worker still attached keeps it; it goes at a later pass, once the worker
has left). No message is ever lost that way, whatever happens at the same time:

- a paused session (which may be resumed) is active: its queue is not even considered;
- a session that starts on the experiment while its queue is being deleted publishes ``mandatory``: a message
  that finds no queue comes back (``basic.return``), and the publisher declares the queue again and publishes
  it again (:mod:`labswarm.queue.publisher`); workers declare it when they start.

Why not ``x-expires``: RabbitMQ would delete an unused queue *with its messages* (a paused session without
workers for longer than the expiry, or a manager down that long), every declaration of an existing queue would
have to change its arguments (RabbitMQ refuses a mismatch: every deployment's queues deleted by hand), and
workers would have to learn the value. The embedded broker's queues are rows of its SQLite file: left alone.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable

from amqp.exceptions import ChannelError
from celery import Celery

from labswarm.queue.names import is_embedded, queue_name

log = logging.getLogger(__name__)


def delete_if_idle(app: Celery, experiment: str) -> bool:
    """Delete the experiment's queue if it is empty and has no consumer (RabbitMQ checks both, atomically).

    Returns:
        True when it was deleted or did not exist; False when RabbitMQ kept it (a message or a consumer).

    Raises:
        OSError, kombu's connection errors: the broker cannot be reached.
    """
    with app.connection_for_write() as conn:
        channel = conn.channel()
        try:
            channel.queue_delete(queue_name(experiment), if_unused=True, if_empty=True)
            return True
        except ChannelError as exc:  # 406 PRECONDITION_FAILED: not empty or in use (the channel is closed)
            if getattr(exc, "code", None) == 404:
                return True
            log.debug("queue of %s kept: %s", experiment, exc)
            return False
        finally:
            with contextlib.suppress(Exception):  # already closed by the broker's refusal
                channel.close()


class QueueCleaner(threading.Thread):
    """Deletes the queues of experiments whose sessions all ended ``delay`` s ago or more (see the module).

    Args:
        app: a Celery app on the broker (RabbitMQ; on the embedded broker :meth:`run` returns at once).
        ended: ``{experiment: Unix time in s when its last session ended}`` for the experiments with no active
            session (called once a pass).
        delay: seconds after that end before the queue is deleted (> 0).
        interval: seconds between passes; default ``delay / 4`` within 0.2 s..60 s.

    Attributes:
        passes: passes done (tests wait on it).
        deleted: the experiments whose queue this cleaner deleted, in order.
    """

    def __init__(self, app: Celery, ended: Callable[[], dict[str, float]], delay: float,
                 interval: float | None = None) -> None:
        super().__init__(name="labswarm-queue-cleaner", daemon=True)
        if not delay > 0:
            raise ValueError(f"delay must be > 0, got {delay}")
        self.app = app
        self.ended = ended
        self.delay = delay
        self.interval = interval if interval is not None else min(max(delay / 4, 0.2), 60.0)
        self.passes = 0
        self.deleted: list[str] = []
        self._done: dict[str, float] = {}  # experiment -> the end its queue was deleted (or found absent) after
        self._halt = threading.Event()

    def run(self) -> None:
        if is_embedded(self.app.conf.broker_url):
            return
        while not self._halt.wait(self.interval):
            try:
                self.sweep()
            except Exception as exc:  # the broker or the database is away: the next pass tries again
                log.warning("queue cleanup pass failed: %s", exc)

    def sweep(self, now: float | None = None) -> list[str]:
        """One pass: delete the queues due; returns the experiments whose queue it deleted."""
        now = time.time() if now is None else now
        gone = []
        for experiment, ended in sorted(self.ended().items()):
            if now - ended < self.delay or self._done.get(experiment) == ended:
                continue
            if delete_if_idle(self.app, experiment):
                self._done[experiment] = ended
                gone.append(experiment)
                log.info("deleted the queue of experiment %s (its last session ended %.0f s ago)", experiment,
                         now - ended)
        self.deleted.extend(gone)
        self.passes += 1
        return gone

    def stop(self, timeout: float = 10.0) -> None:
        """Stop after the current pass."""
        self._halt.set()
        if self.is_alive():
            self.join(timeout)
