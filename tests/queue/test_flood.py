"""Issue 10's flood test: a session over RabbitMQ whose workers start 10 s late is never flooded. Before the
workers start its queue never holds more than the publisher's start window; from the health controller's first
decision to the end its depth stays within max(50, 10 s of the median consume rate). Assertions on depth only."""

from __future__ import annotations

import json
import statistics
import threading
import time
from pathlib import Path

import pytest
from helpers import SR, experiment_dict

from labswarm.config.experiment import parse_experiment
from labswarm.deploy.local import LocalLauncher
from labswarm.run import HealthThread
from labswarm.store import FeatureStore

pytestmark = pytest.mark.slow

#: Seconds the workers start after the session.
LATE = 10.0


class DepthSampler(threading.Thread):
    """Reads the queue's ready messages from the broker every ``period`` s: ``(wall time, depth)`` points."""

    def __init__(self, broker, experiment: str, period: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.broker, self.experiment, self.period = broker, experiment, period
        self.points: list[tuple[float, int]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.period):
            depth = self.broker.queue_depth(self.experiment)
            if depth is not None:
                self.points.append((time.time(), depth))


def test_a_session_whose_workers_start_late_never_floods_its_queue(make_cluster, rabbitmq_url: str,
                                                                      tmp_path: Path) -> None:
    cluster = make_cluster(rabbitmq_url, tones=170)
    cluster.config = parse_experiment(experiment_dict(  # 170 clips x 6 = 1,020 samples of 2 s
        cluster.data, cluster.store_root, name=cluster.name,
        dataset={"root": str(cluster.data), "sample_rate": SR, "segment": {"start": 0.0, "duration": 2.0}},
        transformations=[{"name": "identity"}, *({"name": "gain", "gain_db": g} for g in (-9.0, -6.0, -3.0, 3.0)),
                         {"name": "add_noise", "snr_db": 20.0}],
    ))
    cluster.start_manager()
    cluster.client.post_experiment(cluster.config.model_dump(mode="json"))
    window = cluster.settings.start_window
    broker = cluster.server._server.config.app.state.sessions.broker
    # the manager's default rate (200 tasks/s) and the controller from the start, as `labswarm run` has them
    cluster.session_id = cluster.client.start_session(cluster.name)["id"]
    health = HealthThread(cluster.url, None, None, 2, tmp_path / "health").start()
    sampler = DepthSampler(broker, cluster.name)
    sampler.start()
    try:
        # 1. no worker yet: the publisher stops at its start window
        time.sleep(LATE)  # the scenario's delay, not a check: the checks below are on depth
        before = [d for _, d in sampler.points]
        progress = cluster.progress()
        assert before and max(before) <= window, (max(before), window)
        assert progress["published"] <= window, progress
        assert progress["total"] == 1020 and progress["finished"] == 0

        # 2. the workers start: the controller steers from its first decision to the end
        cluster.launcher = LocalLauncher(cluster.name, cluster.url, broker_url=cluster.broker_url,
                                         log_dir=tmp_path / "logs")
        cluster.launcher.start(2)
        progress = cluster.wait_completed(timeout=300)
    finally:
        sampler.done.set()
        health.stop()
    log = tmp_path / "health" / f"health-{cluster.session_id}.jsonl"
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    first = rows[0]["wall"]
    consume = statistics.median(r["consume_rate"] for r in rows if r["consume_rate"] > 0)
    bound = max(50.0, 10.0 * consume)
    broker_after = [d for wall, d in sampler.points if wall >= first]
    ledger_after = [r["depth"] for r in rows]
    print(f"\nbefore the workers: max depth {max(before)} (window {window}); after the first decision: max depth "
          f"{max(broker_after)} (broker), {max(ledger_after):.0f} (ledger), bound {bound:.0f} "
          f"(median consume {consume:.1f}/s)")
    assert max(broker_after) <= bound, (max(broker_after), bound)
    assert max(ledger_after) <= bound, (max(ledger_after), bound)
    # nothing lost on the way
    assert progress["status"] == "completed", progress
    assert progress["done"] + progress["cached"] == progress["total"] == 1020 and progress["failed"] == 0
    assert FeatureStore(cluster.store_root).stats().entries == 1020 * len(cluster.config.features)
