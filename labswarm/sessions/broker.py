"""The sessions' broker client: declare, publish to, measure and purge the experiments' queues (Celery/kombu)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from contextlib import suppress

from labswarm.queue.app import TASK_NAME, app_queue, declare_queue, make_celery, queue_name
from labswarm.sample import Sample
from labswarm.settings import Settings

log = logging.getLogger(__name__)


class BrokerClient:
    """Publishes the sessions' task messages through a Celery app used for publishing only.

    Args:
        settings: runtime settings (broker URL, queue bound).
    """

    def __init__(self, settings: Settings) -> None:
        self.url = settings.resolved_broker_url()
        self.celery = make_celery(self.url, settings.max_queue_length)

    def declare_queue(self, experiment: str) -> None:
        """Declare the experiment's durable queue (idempotent)."""
        declare_queue(self.celery, experiment)

    def publish(self, session_id: str, experiment: str, sample: Sample, stop: threading.Event) -> bool:
        """Publish one task, retrying with backoff while the broker is unreachable; ``False`` if stopped first."""
        queue = app_queue(self.celery, experiment)
        delay = 0.2
        while not stop.is_set():
            try:
                self.celery.send_task(
                    TASK_NAME, args=(session_id, sample.to_dict()), queue=queue,
                    exchange=queue.exchange, routing_key=queue.routing_key,
                    retry=True, retry_policy={"max_retries": 3, "interval_start": 0.2, "interval_step": 0.5},
                )
                return True
            except Exception as exc:  # broker down, or the queue full (reject-publish): wait, publish again
                log.warning("publish failed (%s: %s); retrying in %.1f s", type(exc).__name__, exc, delay)
                if stop.wait(delay):
                    return False
                delay = min(delay * 2, 2.0)
                with suppress(Exception):
                    self.declare_queue(experiment)
        return False

    def publish_many(self, session_id: str, experiment: str, samples: Sequence[Sample],
                     stop: threading.Event) -> int:
        """Publish the tasks of ``samples`` in order; returns how many were confirmed (a prefix of ``samples``:
        fewer than all only when ``stop`` was set first).
        """
        for n, sample in enumerate(samples):
            if not self.publish(session_id, experiment, sample, stop):
                return n
        return len(samples)

    def queue_depth(self, experiment: str) -> int | None:
        """Ready messages in the experiment's queue, or ``None`` when the broker cannot be asked."""
        try:
            with self.celery.connection_for_read() as conn:
                ok = conn.default_channel.queue_declare(queue=queue_name(experiment), passive=True)
                return int(ok.message_count)
        except Exception as exc:
            log.debug("queue depth of %s unknown: %s", experiment, exc)
            return None

    def purge_queue(self, experiment: str) -> None:
        """Drop every ready message of the experiment's queue (a cancelled or failed session); logs failures."""
        try:
            with self.celery.connection_for_write() as conn:
                conn.default_channel.queue_purge(queue_name(experiment))
        except Exception as exc:
            log.warning("cannot purge the queue of %s: %s", experiment, exc)
