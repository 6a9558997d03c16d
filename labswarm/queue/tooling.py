"""Celery's own tools on labswarm's workers (issue 28): remote control (``celery inspect ping/stats/active``,
``celery control``, Flower's worker pages) and task events (Flower's task pages, ``celery events``).

Two settings, ``LABSWARM_CELERY_REMOTE_CONTROL`` and ``LABSWARM_CELERY_EVENTS`` (``true``/``false``; unset:
:data:`AUTO`, on with RabbitMQ, off with the embedded broker):

- remote control: each worker consumes a broadcast queue of its own (``<name>.celery.pidbox``, auto-delete) and
  answers there; no cost per task. The embedded broker (kombu's SQLAlchemy transport) has no fanout exchange, so
  no broadcast: asking for it there is a :class:`~labswarm.errors.ConfigError`.
- task events: a worker publishes ``task-received``, ``task-started`` and ``task-succeeded``/``-failed`` for each
  task, and a ``worker-heartbeat`` every 2 s (what Flower calls online), to the ``celeryev`` topic exchange;
  nothing is kept unless a monitor listens (its queue expires 60 s after it leaves, Celery's
  ``event_queue_expires``). Three messages per task: the cost was measured with ``bench/celery_events.py``
  (docs/benchmarks/distributed.md, "Celery's events and remote control") and is small beside a feature task,
  hence the default. ``task-sent`` (one more message per publish, from the manager) stays off.

Gossip and mingle (workers listening to each other at start and all along: a cost growing with the square of
the workers) stay off in every case (:mod:`labswarm.queue.worker`).
"""

from __future__ import annotations

from typing import Any

from labswarm.errors import ConfigError
from labswarm.queue.names import is_embedded

#: The default of both settings where the broker supports them (RabbitMQ): on (the measured cost: see the module).
AUTO = True


def tooling(broker_url: str, events: bool | None = None, remote_control: bool | None = None) -> dict[str, Any]:
    """Celery's configuration of task events and remote control on ``broker_url``.

    Args:
        broker_url: the broker (``amqp://...`` or the embedded ``sqla+sqlite:///...``).
        events: send task events and worker heartbeats; ``None``: :data:`AUTO` on RabbitMQ, off on the embedded
            broker (no monitor can read them there).
        remote_control: answer ``celery inspect``/``control`` and Flower; ``None``: on with RabbitMQ, off with the
            embedded broker.

    Returns:
        ``worker_send_task_events``, ``worker_enable_remote_control``, ``task_send_sent_event`` (always off), for
        ``Celery.conf.update``.

    Raises:
        ConfigError: remote control asked of the embedded broker (``LABSWARM_CELERY_REMOTE_CONTROL``).
    """
    embedded = is_embedded(broker_url)
    if remote_control and embedded:
        raise ConfigError([("LABSWARM_CELERY_REMOTE_CONTROL", "the embedded broker has no broadcast (fanout) "
                                                              "exchange: remote control needs RabbitMQ")])
    default = AUTO and not embedded
    return {"worker_send_task_events": default if events is None else bool(events),
            "worker_enable_remote_control": default if remote_control is None else bool(remote_control),
            "task_send_sent_event": False}
