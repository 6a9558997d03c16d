"""The health controller steering a real session over RabbitMQ (issue 4's acceptance): from a flood to the
target band, following a lost worker and added ones, never past the queue's hard bound. Bounded in time; the
checks are on averages over windows, not on instants."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import pytest
from helpers import SR, experiment_dict

from labswarm.config import parse_experiment
from labswarm.run import HealthThread

pytestmark = pytest.mark.slow
MGMT_API = "http://guest:guest@127.0.0.1:15672"
BOUND = 1500


def _rows(log: Path, since: float) -> list[dict]:
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return [r for r in rows if r["t"] >= since]


def _window(log: Path, seconds: float) -> tuple[list[dict], float]:
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    end = rows[-1]["t"]
    return [r for r in rows if r["t"] >= end - seconds], end


def test_controller_converges_and_follows_the_workers(make_cluster, rabbitmq_url: str, tmp_path: Path) -> None:
    cluster = make_cluster(rabbitmq_url, tones=150)
    semitones = [s for s in range(-12, 13) if s]  # 24 pitch shifts per clip: 3,600 samples of ~40 ms
    cluster.config = parse_experiment(experiment_dict(
        cluster.data, cluster.store_root, name=cluster.name,
        dataset={"root": str(cluster.data), "sample_rate": SR, "segment": {"start": 0.0, "duration": 10.0}},
        transformations=[{"name": "pitch_shift", "semitones": s} for s in semitones],
        features=[{"name": "mel", "n_mels": 64}],
    ))
    cluster.settings = cluster.settings.model_copy(update={"max_queue_length": BOUND})
    cluster.start(workers=2, rate=300.0)  # deliberately far above what 2 workers consume
    health = HealthThread(cluster.url, None, MGMT_API, 2, tmp_path / "health").start()
    log = tmp_path / "health" / f"health-{cluster.session_id}.jsonl"
    try:
        time.sleep(45)
        # 1. converged: depth in the target band, publish rate within 15 % of the consume rate
        rows, _ = _window(log, 15)
        consume = statistics.mean(r["consume_rate"] for r in rows)
        rate = statistics.mean(r["new_rate"] for r in rows)
        target = 3.0 * consume
        depth = statistics.median(r["depth"] for r in rows)
        assert abs(rate - consume) <= 0.15 * consume, (rate, consume)
        assert 0.3 * target <= depth <= 2.0 * target, (depth, target)
        two_workers = consume

        # 2. one of the two workers dies: the rate follows the lower consume rate
        cluster.kill_worker()
        time.sleep(30)
        rows, _ = _window(log, 10)
        rate_one = statistics.mean(r["new_rate"] for r in rows)
        consume_one = statistics.mean(r["consume_rate"] for r in rows)
        # the rate goes down with the consume rate; how far depends on the machine, not on the controller: on 2
        # cores the surviving worker takes the freed core's share of the manager's and the broker's CPU and
        # consumes ~0.75x of what two did (0.753x in one quiet CI run), not 0.5x
        assert rate_one < 0.9 * two_workers, (rate_one, two_workers)
        assert abs(rate_one - consume_one) <= 0.3 * consume_one, (rate_one, consume_one)

        # 3. two workers join: the rate rises
        cluster.launcher.scale(3)
        time.sleep(30)
        rows, _ = _window(log, 10)
        rate_three = statistics.mean(r["new_rate"] for r in rows)
        assert rate_three > 1.3 * rate_one, (rate_three, rate_one)

        # the hard bound held throughout (the controller's view lags; the broker's own count is checked too)
        assert max(r["depth"] for r in _rows(log, 0)) <= BOUND
        assert cluster.server._server.config.app.state.sessions.broker.queue_depth(cluster.name) <= BOUND
        print(f"\nconsume {two_workers:.1f}/s with 2 workers, rate {rate_one:.1f}/s with 1, {rate_three:.1f}/s with 3")
    finally:
        health.stop()
        if cluster.session_id and cluster.progress()["status"] in ("running", "paused"):
            cluster.client.cancel(cluster.session_id)
