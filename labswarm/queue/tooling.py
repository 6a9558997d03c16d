"""Celery's own tools on labswarm's workers (issue 28): remote control (``celery inspect ping/stats/active``,
``celery control``, Flower's worker pages) and task events (Flower's task pages, ``celery events``).

Two settings, ``LABSWARM_CELERY_REMOTE_CONTROL`` and ``LABSWARM_CELERY_EVENTS`` (``true``/``false``):

- remote control (unset: on with RabbitMQ, off with the embedded broker): each worker consumes a broadcast queue
  of its own (``<name>.celery.pidbox``, auto-delete) and answers there; no cost per task. The embedded broker
  (kombu's SQLAlchemy transport) has no fanout exchange, so no broadcast: asking for it there is a
  :class:`~labswarm.errors.ConfigError`.
- task events (unset: off, switched on at run time by a monitor): a worker that sends them publishes
  ``task-received``, ``task-started`` and ``task-succeeded``/``-failed`` for each task to the ``celeryev`` topic
  exchange; nothing is kept unless a monitor listens (its queue expires 60 s after it leaves, Celery's
  ``event_queue_expires``). Nothing in labswarm reads them (the health controller reads the manager's ledger and
  RabbitMQ's management API; the dashboard, the manager): only Flower and ``celery events`` do. Flower switches
  them on by itself (its ``--enable_events``, on by default: ``celery control enable_events`` every 5 s, which
  reaches the workers started after it too), and ``celery events`` after ``celery control enable_events``; they
  stay on until ``celery control disable_events``. So a worker sends none by default: three messages per task
  cost its main process and RabbitMQ about 1.5 ms of CPU per feature sample on a 2-core machine (measured with
  ``bench/distributed.py``'s CPU meter; docs/benchmarks/distributed.md, issue 27). ``true``: from the worker's
  start. ``task-sent`` (one more message per publish, from the manager) stays off.
- worker heartbeats (``worker-heartbeat`` every 2 s, what Flower calls online) go whenever either is on
  (:func:`heartbeats`): Celery's ``enable_events`` turns task events on only in a worker whose event dispatcher
  runs, and the heartbeats are what keeps it running.

Gossip and mingle (workers listening to each other at start and all along: a cost growing with the square of
the workers) stay off in every case (:mod:`labswarm.queue.worker`).
"""

from __future__ import annotations

from typing import Any

from labswarm.errors import ConfigError
from labswarm.queue.names import is_embedded

#: The default of remote control where the broker supports it (RabbitMQ): on (no cost per task).
AUTO = True
#: The default of task events: off; a monitor switches them on at run time (see the module for who reads them).
EVENTS = False


def tooling(broker_url: str, events: bool | None = None, remote_control: bool | None = None) -> dict[str, Any]:
    """Celery's configuration of task events and remote control on ``broker_url``.

    Args:
        broker_url: the broker (``amqp://...`` or the embedded ``sqla+sqlite:///...``).
        events: send task events from the start; ``None``: :data:`EVENTS` (off; Flower or ``celery control
            enable_events`` switches them on through remote control).
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
    return {"worker_send_task_events": EVENTS if events is None else bool(events),
            "worker_enable_remote_control": default if remote_control is None else bool(remote_control),
            "task_send_sent_event": False}


def heartbeats(conf: Any) -> bool:
    """Whether a worker with Celery configuration ``conf`` sends worker heartbeats (Celery's ``--without-heartbeat``
    otherwise): when it sends task events, or answers remote control (so that a monitor's ``enable_events`` can
    switch its task events on: Celery does it only where the worker's event dispatcher runs)."""
    return bool(conf.worker_send_task_events or conf.worker_enable_remote_control)
