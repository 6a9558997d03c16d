"""The Celery application: broker settings that lose no task, and one durable queue per experiment.

Settings (and why), for RabbitMQ:

- durable queue ``labswarm.<experiment>``, persistent messages: survive a broker restart;
- ``confirm_publish``: a publish returns only once the broker has the message (without it a publish during a
  broker memory or disk alarm is silently dropped); not on a worker's app, which publishes only Celery's events
  and remote-control replies (:mod:`labswarm.queue.tooling`);
- ``task_acks_late`` + ``task_reject_on_worker_lost``: a task is acknowledged after it ran; a worker killed
  mid-task gives the message back to the queue and another worker runs it;
- prefetch multiplier :data:`PREFETCH_MULTIPLIER` (1): a worker holds one task per process. Held tasks are
  unacknowledged (a killed worker's channel closes and RabbitMQ gives them all back), so a higher value is safe;
  it was tried (4) and is not used: no measured gain, and weighted shares through RabbitMQ's round robin drifted
  (1:1 weights gave 0.60/0.40 in tests/queue/test_fair_share.py, past its 20 % bound);
- JSON serialization only.

RabbitMQ closes a channel whose delivery stays unacknowledged longer than ``consumer_timeout`` (30 min by
default): set it above the longest task, e.g. ``consumer_timeout = 7200000`` (ms) in ``rabbitmq.conf``. Feature
tasks take well under a second, so the default is ample here.

The embedded broker (``sqla+sqlite:///...``, kombu's SQLAlchemy transport) needs no server. It cannot redeliver
the task of a killed worker; the session ledger republishes whatever has no outcome once the queue has drained,
which makes it as safe, if slower to notice. Its transport is :mod:`labswarm.queue.embedded`'s (read-first polls,
adaptive polling, ``synchronous=NORMAL``: durable against a killed process, not against a power loss).
"""

from __future__ import annotations

import sqlite3
from contextlib import closing

from amqp.exceptions import PreconditionFailed
from celery import Celery

from labswarm.errors import ConfigError, LabswarmError
from labswarm.queue.names import (
    EXCHANGE,
    TASK_NAME,
    app_queue,
    connection_name,
    embedded_lock,
    embedded_path,
    experiment_queue,
    is_embedded,
    message_bound,
    queue_name,
)
from labswarm.queue.tooling import tooling

__all__ = [
    "EMBEDDED_POLLING_INTERVAL",
    "EXCHANGE",
    "PREFETCH_MULTIPLIER",
    "TASK_NAME",
    "app_queue",
    "declare_queue",
    "experiment_queue",
    "is_embedded",
    "make_celery",
    "message_bound",
    "prepare_embedded_broker",
    "queue_name",
]

#: Messages each worker process holds (Celery's ``worker_prefetch_multiplier``): with late acks the ones held and
#: not yet run go back to the queue when their worker dies. 1: see the module docstring for why not 4. The queue's
#: depth and bound count only the messages not yet delivered: a consumer holds up to this many more.
PREFETCH_MULTIPLIER = 1
#: Seconds between polls of the embedded broker while messages come (kombu's default is 1 s): a worker that has
#: just acked its task waits up to this long before it fetches the next one when it holds no other. An idle worker
#: backs off to :data:`labswarm.queue.embedded.POLL_MAX` (see :mod:`labswarm.queue.embedded`).
EMBEDDED_POLLING_INTERVAL = 0.005  # labswarm.queue.embedded.POLL_FAST (not imported here: see prepare_embedded_broker)
#: The AMQP heartbeat timeout of the app's RabbitMQ connections, in seconds, when none is given: the default of the
#: setting ``broker_heartbeat`` (:class:`~labswarm.settings.Settings`), the value labswarm always used.
DEFAULT_HEARTBEAT = 30.0


def declare_queue(app: Celery, experiment: str) -> None:
    """Declare the experiment's durable queue (idempotent).

    On the embedded broker kombu creates its tables and the queue's row by check-then-insert, so processes that
    declare at once (a manager starting a session while its workers start) fail with "table already exists" or
    a unique-constraint error: there the declaration holds a lock between processes, and workers declare before
    they consume.
    """
    with embedded_lock(app.conf.broker_url), app.connection_for_write() as conn:
        try:
            app_queue(app, experiment)(conn.default_channel).declare()
        except PreconditionFailed as exc:
            raise LabswarmError(
                f"queue {queue_name(experiment)} exists with other arguments than this labswarm declares "
                f"(max length {app.conf.get('labswarm_max_queue_length')}): delete it "
                f"(rabbitmqctl delete_queue {queue_name(experiment)}) or use the same LABSWARM_MAX_QUEUE_LENGTH; "
                f"{exc}"
            ) from exc


def prepare_embedded_broker(broker_url: str) -> None:
    """Create the SQLite file of an embedded broker in WAL mode (commits ~10x faster than the default journal)
    and make ``sqla+`` URLs use labswarm's transport in this process (:mod:`labswarm.queue.embedded`: read-first
    polls, claimed messages deleted, ``synchronous=NORMAL``, adaptive polling from
    :data:`EMBEDDED_POLLING_INTERVAL`)."""
    from labswarm.db.engine import enable_wal  # here: SQLAlchemy is the embedded broker's alone (a worker on
    from labswarm.queue.embedded import install  # RabbitMQ never imports it: ~0.1 s of CPU of its start, issue 27)

    install()
    path = embedded_path(broker_url)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with closing(sqlite3.connect(path)) as conn:
            enable_wal(conn)


def make_celery(broker_url: str, max_queue_length: int | None = None, *, role: str = "manager",
                experiment: str | None = None, events: bool | None = None,
                remote_control: bool | None = None, heartbeat: float = DEFAULT_HEARTBEAT) -> Celery:
    """A Celery app on ``broker_url`` with labswarm's no-loss settings and its task registered.

    Args:
        broker_url: ``amqp://user:pass@host:5672/vhost`` (RabbitMQ) or ``sqla+sqlite:///path`` (embedded).
        max_queue_length: the hard bound of every experiment queue (see :func:`experiment_queue`).
        role: who uses the app (``manager``, ``worker``): its RabbitMQ connections are named after it and
            ``experiment`` (:func:`~labswarm.queue.names.connection_name`), and so are its publishers'.
        experiment: the experiment the app serves, if one.
        events, remote_control: Celery's task events and remote control (``None``: on with RabbitMQ, off with
            the embedded broker; :mod:`labswarm.queue.tooling`).
        heartbeat: the AMQP heartbeat timeout of the app's RabbitMQ connections, in seconds (the setting
            ``broker_heartbeat``, :class:`~labswarm.settings.Settings`); 0: no heartbeats. Unused by the embedded
            broker.

    Raises:
        ConfigError: remote control asked of the embedded broker; a negative ``heartbeat``.
    """
    if heartbeat < 0:
        raise ConfigError([("broker_heartbeat", f"must be 0 (off) or a positive number of seconds, got {heartbeat}")])
    app = Celery("labswarm", broker=broker_url, set_as_current=False)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        result_backend=None,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure_or_timeout=True,
        worker_prefetch_multiplier=PREFETCH_MULTIPLIER,
        task_default_delivery_mode="persistent",
        task_default_exchange=EXCHANGE.name,
        task_default_exchange_type="direct",
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        worker_hijack_root_logger=False,
        **tooling(broker_url, events, remote_control),  # celery inspect, Flower (issue 28)
        enable_utc=True,
        labswarm_max_queue_length=max_queue_length,
        labswarm_role=role,
        labswarm_experiment=experiment,
    )
    if is_embedded(broker_url):
        prepare_embedded_broker(broker_url)
        app.conf.broker_transport_options = {"connect_args": {"timeout": 30}}
    else:
        app.conf.broker_transport_options = {
            # a worker's Celery publishes only events and remote-control replies, which need no confirm (one
            # synchronous round trip each: labswarm.queue.tooling); labswarm's messages go through
            # labswarm.queue.publisher, which confirms on its own connection
            "confirm_publish": role != "worker",
            "client_properties": {"connection_name": connection_name(role, experiment)},
        }
        app.conf.broker_heartbeat = heartbeat
    from labswarm.queue.task import register

    register(app)
    return app
