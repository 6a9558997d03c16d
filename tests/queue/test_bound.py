"""The hard safety net: a queue declared with a max length and reject-publish never grows past it; the
publisher treats the refusals as back-pressure and loses nothing (real RabbitMQ)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from helpers import wait_until

from labswarm.queue.app import queue_name

pytestmark = pytest.mark.slow


def test_full_queue_pushes_back_and_loses_nothing(make_cluster, rabbitmq_url: str, tmp_path: Path) -> None:
    cluster = make_cluster(rabbitmq_url, tones=8)  # 24 samples
    cluster.settings = cluster.settings.model_copy(update={"max_queue_length": 5})
    cluster.start_manager()
    cluster.client.post_experiment(cluster.config.model_dump(mode="json"))
    session = cluster.client.start_session(cluster.name, 1000.0)  # far faster than anything consumes: no worker
    cluster.session_id = session["id"]
    broker = cluster.server._server.config.app.state.sessions.broker
    depths: list[int | None] = []

    def filled() -> bool:
        depths.append(broker.queue_depth(cluster.name))
        return (depths[-1] or 0) >= 5

    # filled to the bound (a wait: a loaded machine's session may take longer than the 4 s this sampled for), then
    # watched a while longer: never past it
    wait_until(filled, "the queue filled to its bound", 120)
    for _ in range(20):
        time.sleep(0.1)
        depths.append(broker.queue_depth(cluster.name))
    assert max(d for d in depths if d is not None) == 5, depths
    assert cluster.progress()["status"] == "running"
    # workers arrive: the publisher gets through as they drain the queue, and every sample ends done
    from labswarm.deploy.local import LocalLauncher

    cluster.launcher = LocalLauncher(cluster.name, cluster.url, broker_url=cluster.broker_url,
                                   log_dir=tmp_path / "logs")
    cluster.launcher.start(2)
    progress = cluster.wait_completed()
    cluster.assert_no_loss(progress)
    assert progress["done"] == 24
    assert queue_name(cluster.name) == progress["queue"]
