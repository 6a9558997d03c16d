"""``labswarm worker`` exits with the status Celery's worker ends with (as Celery's command line does): a worker
whose queue declaration RabbitMQ refuses stops with Celery's "Unrecoverable error" and must exit non-zero, or a
supervisor restarting it on failure (docker/compose.yml: ``condition: on-failure``) leaves the queue a consumer
short without a sign."""

from __future__ import annotations

import os
import subprocess
import sys

from helpers import delete_queue
from kombu import Connection, Queue

from labswarm.queue.app import queue_name


def test_a_worker_whose_queue_is_refused_exits_non_zero(make_cluster, rabbitmq_url: str) -> None:
    cluster = make_cluster(rabbitmq_url, tones=1)
    name = queue_name(cluster.name)
    try:
        cluster.start_manager()
        assert cluster.client is not None
        cluster.client.post_experiment(cluster.config.model_dump(mode="json"))
        # the queue already declared unbounded: the worker's declaration (x-max-length) is refused, 406
        with Connection(rabbitmq_url, connect_timeout=10) as conn:
            Queue(name, routing_key=name, durable=True)(conn.default_channel).declare()
        env = {**os.environ, "LABSWARM_BROKER_URL": rabbitmq_url}
        done = subprocess.run([sys.executable, "-m", "labswarm.cli", "worker", "--experiment", cluster.name,
                               "--manager", cluster.url], env=env, capture_output=True, text=True, timeout=180)
        assert done.returncode != 0, done.stderr[-3000:]
        assert "PRECONDITION_FAILED" in done.stderr, done.stderr[-3000:]
    finally:
        delete_queue(rabbitmq_url, name)
