"""Queues of ended experiments are deleted after a delay, and no message is ever lost by it (issue 28), on the
real RabbitMQ: a queue that holds a message or has a consumer is kept, an empty unused one whose experiment ended
``delay`` ago goes; end to end, a manager deletes the queue of an experiment whose session completed once its
worker left, a paused session's queue is kept with its messages however long it waits, and the session resumed
later completes with every sample (the queue declared again on the way)."""

from __future__ import annotations

import shutil
import time
import uuid

import pytest
from helpers import wait_until
from kombu import Connection, Producer

from labswarm.deploy.local import LocalLauncher
from labswarm.queue.app import app_queue, make_celery, queue_name
from labswarm.queue.cleanup import QueueCleaner


def _depth(url: str, experiment: str) -> int | None:
    """Ready messages of the experiment's queue; ``None``: it does not exist."""
    with Connection(url) as conn:
        channel = conn.channel()
        try:
            return channel.queue_declare(queue_name(experiment), passive=True).message_count
        except Exception as exc:
            if getattr(exc, "code", None) == 404:
                return None
            raise


def test_only_an_empty_unused_queue_of_an_ended_experiment_goes(rabbitmq_url: str) -> None:
    app = make_celery(rabbitmq_url)
    names = {kind: f"clean-{kind}-{uuid.uuid4().hex[:6]}" for kind in ("message", "consumer", "idle", "recent")}
    now = time.time()
    ended = {names["message"]: now - 100, names["consumer"]: now - 100, names["idle"]: now - 100,
             names["recent"]: now - 1}
    cleaner = QueueCleaner(app, lambda: ended, delay=10)
    with Connection(rabbitmq_url) as conn:
        for name in names.values():
            app_queue(app, name)(conn.default_channel).declare()
        Producer(conn.default_channel).publish(b"x", exchange="", routing_key=queue_name(names["message"]))
        consumer = conn.channel()
        consumer.basic_consume(queue_name(names["consumer"]), callback=lambda _m: None)
        try:
            assert cleaner.sweep() == [names["idle"]]
            assert _depth(rabbitmq_url, names["idle"]) is None
            assert _depth(rabbitmq_url, names["message"]) == 1  # RabbitMQ refused: not empty
            assert _depth(rabbitmq_url, names["consumer"]) == 0  # refused: a consumer
            assert _depth(rabbitmq_url, names["recent"]) == 0  # not due
        finally:
            consumer.close()
        assert cleaner.sweep(now=now + 20) == [names["consumer"], names["recent"]]  # the consumer left; now due
        assert _depth(rabbitmq_url, names["message"]) == 1
        conn.default_channel.queue_delete(queue_name(names["message"]))


@pytest.mark.slow  # two sessions with workers: ~60 s on the loaded 2-core machine
def test_a_manager_deletes_an_ended_queue_and_keeps_a_paused_one(rabbitmq_url: str, make_cluster) -> None:
    cluster = make_cluster(broker_url=rabbitmq_url, tones=4)
    cluster.settings = cluster.settings.model_copy(update={"queue_delete_after": 1.0})
    cluster.start(workers=1, rate=50.0)
    cluster.assert_no_loss(cluster.wait_completed())
    app = cluster.server.app
    wait_until(lambda: _depth(rabbitmq_url, cluster.name) == 0, "the drained queue", 10)
    cluster.launcher.stop(timeout=15.0)  # the worker leaves: its consumer no longer keeps the queue
    wait_until(lambda: _depth(rabbitmq_url, cluster.name) is None, "the ended experiment's queue deleted", 30)
    assert app.state.queue_cleaner.deleted == [cluster.name]

    # a session without workers, paused with messages waiting: kept past the delay, however many passes
    shutil.rmtree(cluster.store_root)  # computed again (cached samples are recorded without a message)
    second = cluster.client.start_session(cluster.name, 50.0)
    cluster.session_id = second["id"]
    wait_until(lambda: (_depth(rabbitmq_url, cluster.name) or 0) > 0, "messages in the queue declared again", 30)
    cluster.client.pause(second["id"])
    waiting = _depth(rabbitmq_url, cluster.name)
    passes = app.state.queue_cleaner.passes
    wait_until(lambda: app.state.queue_cleaner.passes >= passes + 8, "eight cleaner passes (2 s, twice the delay)", 30)
    assert _depth(rabbitmq_url, cluster.name) == waiting
    cluster.client.resume(second["id"])
    cluster.launcher = LocalLauncher(cluster.name, cluster.url, broker_url=rabbitmq_url,
                                     log_dir=cluster.tmp_path / "logs", restart=None)
    cluster.launcher.start(1)
    cluster.assert_no_loss(cluster.wait_completed())
    assert app.state.queue_cleaner.deleted == [cluster.name]
