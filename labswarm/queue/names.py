"""The names labswarm's messages travel under: the task, the exchange, one durable queue per experiment and its
bound; the name each broker connection shows (:func:`connection_name`); which broker URL is the embedded one,
and its lock between processes. Shared by the Celery app (:mod:`labswarm.queue.app`), the task and the publisher.
"""

from __future__ import annotations

import fcntl
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from celery import Celery
from kombu import Exchange, Queue

#: The name of the one task labswarm sends.
TASK_NAME = "labswarm.compute"
#: The exchange every experiment queue is bound to (direct; routing key = queue name).
EXCHANGE = Exchange("labswarm", type="direct", durable=True)


def queue_name(experiment: str) -> str:
    """The queue of an experiment: ``labswarm.<experiment>``."""
    return f"labswarm.{experiment}"


def connection_name(role: str, experiment: str | None = None) -> str:
    """The name a broker connection carries (AMQP client property ``connection_name``, shown by RabbitMQ's
    management UI, ``rabbitmqctl list_connections client_properties`` and its HTTP API):
    ``labswarm <role> [<experiment>] on <host> pid <pid>``.

    Args:
        role: what the connection is for: ``manager``, ``manager publisher``, ``worker``, ``worker publisher``.
        experiment: the experiment (or ``<n>-experiments``) the connection serves, when it serves one.
    """
    what = f"labswarm {role} {experiment}" if experiment else f"labswarm {role}"
    return f"{what} on {socket.gethostname()} pid {os.getpid()}"


def experiment_queue(experiment: str, max_length: int | None = None) -> Queue:
    """The durable kombu queue of an experiment.

    Args:
        experiment: the experiment's name.
        max_length: the hard bound on messages waiting (``x-max-length``) with ``x-overflow: reject-publish``:
            past it RabbitMQ refuses new messages, and the publisher, which waits for confirms, backs off and
            publishes them again (back-pressure; nothing is lost). ``None``: unbounded. The embedded broker
            ignores it. Every declaration of a queue must use the same value (RabbitMQ refuses a mismatch).
    """
    name = queue_name(experiment)
    arguments = {"x-max-length": int(max_length), "x-overflow": "reject-publish"} if max_length else None
    return Queue(name, EXCHANGE, routing_key=name, durable=True, queue_arguments=arguments)


def message_bound(max_queue_length: int | None, samples_per_message: int = 1) -> int | None:
    """The queue's ``x-max-length`` in messages for a bound of ``max_queue_length`` samples when each message
    carries up to ``samples_per_message`` (rounded up: the bound in samples holds to within one message).
    ``None`` or 0: unbounded. The manager and its workers compute it alike (from the manager's ``/settings``), so
    they declare the queue with the same arguments."""
    if not max_queue_length:
        return max_queue_length
    return -(-int(max_queue_length) // max(1, int(samples_per_message)))


def app_queue(app: Celery, experiment: str) -> Queue:
    """:func:`experiment_queue` with the bound configured on ``app`` (see :func:`labswarm.queue.app.make_celery`)."""
    return experiment_queue(experiment, app.conf.get("labswarm_max_queue_length"))


def is_embedded(broker_url: str) -> bool:
    """Whether ``broker_url`` is the server-less SQLAlchemy transport."""
    return broker_url.startswith(("sqla+", "sqlalchemy+"))


def embedded_path(broker_url: str) -> Path | None:
    """The SQLite file of an embedded broker URL, else ``None``."""
    if not is_embedded(broker_url):
        return None
    url = broker_url.split("+", 1)[1]
    return Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite:///") else None


@contextmanager
def embedded_lock(broker_url: str) -> Iterator[None]:
    """An exclusive lock between processes on ``<broker file>.lock`` for the embedded broker; no-op otherwise."""
    path = embedded_path(broker_url)
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
