"""Consumers the dashboard shows for a session's queue, read from a real RabbitMQ (a passive declare's consumer
count) and from the embedded broker (no such count: ``None``, shown "unknown")."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import delete_queue
from kombu import Connection, Consumer, Queue

from labswarm.queue.app import queue_name
from labswarm.sessions.broker import BrokerClient
from labswarm.settings import Settings
from labswarm.ui.seen import consumers

RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672//"


def _rabbitmq() -> None:
    try:
        with Connection(RABBITMQ_URL, connect_timeout=3) as conn:
            conn.ensure_connection(max_retries=1)
    except Exception as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"RabbitMQ is not reachable at {RABBITMQ_URL}: {exc}")
        pytest.skip(f"RabbitMQ is not reachable at {RABBITMQ_URL}: {exc}")


def test_consumers_are_rabbitmqs_count_and_unknown_on_the_embedded_broker(tmp_path: Path) -> None:
    _rabbitmq()
    experiment = f"ui-{uuid.uuid4().hex[:10]}"
    broker = BrokerClient(Settings(home=tmp_path, broker_url=RABBITMQ_URL))
    service = SimpleNamespace(broker=broker)  # consumers() reads the session service's broker client only
    try:
        assert consumers(service, experiment) is None  # no such queue yet: unknown, not an error
        broker.declare_queue(experiment)
        assert consumers(service, experiment) == 0
        with Connection(RABBITMQ_URL) as conn, conn.channel() as channel:
            queue = Queue(queue_name(experiment), no_declare=True)
            with Consumer(channel, [queue], callbacks=[lambda body, message: None]):
                assert consumers(service, experiment) == 1
        assert consumers(service, experiment) == 0
    finally:
        broker.close()
        delete_queue(RABBITMQ_URL, queue_name(experiment))
    embedded = BrokerClient(Settings(home=tmp_path))
    try:
        embedded.declare_queue(experiment)
        assert consumers(SimpleNamespace(broker=embedded), experiment) is None
    finally:
        embedded.close()
