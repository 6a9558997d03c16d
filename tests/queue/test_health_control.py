"""The health controller steering a real session over RabbitMQ (issue 4's acceptance): from a flood to the
target band, following a lost worker and added ones, never past the queue's hard bound. Bounded in time; the
checks are on averages over windows, not on instants."""

from __future__ import annotations

import itertools
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import SR, experiment_dict

from labswarm.config.experiment import parse_experiment
from labswarm.run import HealthThread

pytestmark = pytest.mark.slow
MGMT_API = "http://guest:guest@127.0.0.1:15672"
BOUND = 1500
#: Seconds of decisions in a row a phase's condition must hold before the test moves on (see :func:`_settle`).
HOLD = 5.0


def _rows(log: Path, since: float) -> list[dict]:
    # whole lines only: the loop may be appending one while the test polls
    lines = log.read_text().splitlines(keepends=True)
    rows = [json.loads(line) for line in lines if line.endswith("\n") and line.strip()]
    return [r for r in rows if r["t"] >= since]


def _settle(log: Path, since_wall: float, seconds: float, measure: Callable[[list[dict]], dict[str, float]],
            holds: Callable[[dict[str, float]], bool], deadline: float) -> dict[str, float]:
    """Wait for the controller's decisions to meet ``holds``, not for a fixed period.

    Each new decision in ``log`` closes a window: the rows of the last ``seconds`` s, all logged after
    ``since_wall`` (wall time), summed up by ``measure``. Returns the measures of the first window after which
    ``holds`` was true for :data:`HOLD` s of decisions in a row (about 6 windows: settled, not a passing
    moment), or, after ``deadline`` s, those of the last window: the phase's fixed length before, so that the
    caller's assertions then judge what the fixed wait judged.
    """
    end = time.monotonic() + deadline
    streak_from, measured, last_t = None, None, None
    while True:
        rows = [r for r in _rows(log, 0.0) if r["wall"] >= since_wall] if log.is_file() else []
        if rows and rows[-1]["t"] != last_t and rows[-1]["t"] - rows[0]["t"] >= seconds:
            last_t = rows[-1]["t"]
            measured = measure([r for r in rows if r["t"] >= last_t - seconds])
            if not holds(measured):
                streak_from = None
            elif streak_from is None:
                streak_from = last_t
            if streak_from is not None and last_t - streak_from >= HOLD:
                return measured
        if time.monotonic() > end and measured is not None:
            return measured
        if time.monotonic() > end + 30:
            pytest.fail(f"no full window of {seconds} s of decisions in {log} after {deadline + 30:.0f} s")
        time.sleep(0.25)


def _rates(rows: list[dict]) -> dict[str, float]:
    return {"rate": statistics.mean(r["new_rate"] for r in rows),
            "consume": statistics.mean(r["consume_rate"] for r in rows),
            "depth": statistics.median(r["depth"] for r in rows)}


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
        # each phase waits until its condition has held for HOLD s, at most the phase's fixed length of before
        # (45, 30, 30 s): then the same checks, on the window the fixed wait ended with
        # 1. converged: depth in the target band, publish rate within 15 % of the consume rate
        def converged(m: dict[str, float]) -> bool:
            return (abs(m["rate"] - m["consume"]) <= 0.15 * m["consume"]
                    and 0.3 * 3.0 * m["consume"] <= m["depth"] <= 2.0 * 3.0 * m["consume"])

        phases = [time.monotonic()]
        m = _settle(log, 0.0, 15, _rates, converged, deadline=45)
        phases.append(time.monotonic())
        rate, consume, depth = m["rate"], m["consume"], m["depth"]
        target = 3.0 * consume
        assert abs(rate - consume) <= 0.15 * consume, (rate, consume)
        assert 0.3 * target <= depth <= 2.0 * target, (depth, target)
        two_workers = consume

        # 2. one of the two workers dies: the rate follows the lower consume rate (windows after the kill only)
        cluster.kill_worker()
        # the rate goes down with the consume rate; how far depends on the machine, not on the controller: on 2
        # cores the surviving worker takes the freed core's share of the manager's and the broker's CPU and
        # consumes ~0.75x of what two did (0.753x in one quiet CI run), not 0.5x
        def follows(m: dict[str, float]) -> bool:
            return m["rate"] < 0.9 * two_workers and abs(m["rate"] - m["consume"]) <= 0.3 * m["consume"]

        m = _settle(log, time.time(), 10, _rates, follows, deadline=30)
        phases.append(time.monotonic())
        rate_one, consume_one = m["rate"], m["consume"]
        assert rate_one < 0.9 * two_workers, (rate_one, two_workers)
        assert abs(rate_one - consume_one) <= 0.3 * consume_one, (rate_one, consume_one)

        # 3. two workers join: the rate rises (windows after their pools started only: a worker's start, ~3 s of
        # imports on a quiet machine and over 30 s at load 20, is the machine's, not the controller's)
        cluster.launcher.scale(3)
        for worker in cluster.worker_processes():
            cluster.pool_processes(worker, timeout=120)
        rate_three = _settle(log, time.time(), 10, _rates, lambda m: m["rate"] > 1.3 * rate_one, deadline=30)["rate"]
        phases.append(time.monotonic())
        assert rate_three > 1.3 * rate_one, (rate_three, rate_one)

        # the hard bound held throughout (the controller's view lags; the broker's own count is checked too)
        assert max(r["depth"] for r in _rows(log, 0)) <= BOUND
        assert cluster.server._server.config.app.state.sessions.broker.queue_depth(cluster.name) <= BOUND
        print(f"\nconsume {two_workers:.1f}/s with 2 workers, rate {rate_one:.1f}/s with 1, {rate_three:.1f}/s with 3; "
              f"phases {', '.join(f'{b - a:.0f}' for a, b in itertools.pairwise(phases))} s")
    finally:
        health.stop()
        if cluster.session_id and cluster.progress()["status"] in ("running", "paused"):
            cluster.client.cancel(cluster.session_id)
