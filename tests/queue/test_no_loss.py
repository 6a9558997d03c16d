"""No sample is lost, nor stored twice, whatever dies mid-session: contract tests on a real RabbitMQ."""

from __future__ import annotations

import subprocess
import time

import pytest

pytestmark = pytest.mark.slow


def test_pool_process_killed(make_cluster, rabbitmq_url: str) -> None:
    cluster = make_cluster(rabbitmq_url)
    cluster.start(workers=2)
    cluster.wait_outcomes()
    killed = cluster.kill_pool_process()
    progress = cluster.wait_completed()
    cluster.assert_no_loss(progress)
    # the worker replaced its pool process and kept consuming
    workers = cluster.worker_processes()
    assert len(workers) == 2
    assert killed not in [p.pid for w in workers for p in cluster.pool_processes(w)]


def test_whole_worker_killed(make_cluster, rabbitmq_url: str) -> None:
    cluster = make_cluster(rabbitmq_url)
    cluster.start(workers=2)
    cluster.wait_outcomes()
    cluster.kill_worker()
    at_kill = cluster.progress()["finished"]
    assert len(cluster.worker_processes()) == 1
    progress = cluster.wait_completed()
    assert progress["finished"] > at_kill  # the other worker went on
    cluster.assert_no_loss(progress)


def test_broker_restarted(make_cluster, rabbitmq_url: str, rabbitmqctl: str) -> None:
    def ctl(*args: str) -> None:
        subprocess.run([rabbitmqctl, *args], check=True, capture_output=True, timeout=120)

    cluster = make_cluster(rabbitmq_url)
    cluster.start(workers=2)
    cluster.wait_outcomes()
    ctl("stop_app")  # the broker application stops; durable queues and persistent messages survive
    try:
        time.sleep(3)
    finally:
        ctl("start_app")
        ctl("await_startup", "--timeout", "60")
    progress = cluster.wait_completed()
    cluster.assert_no_loss(progress)


def test_manager_restarted(make_cluster, rabbitmq_url: str) -> None:
    cluster = make_cluster(rabbitmq_url)
    cluster.start(workers=2, rate=10.0)
    before = cluster.wait_for(lambda p: p["finished"] >= 6 and p["published"] >= 12, "outcomes")
    cluster.stop_manager()
    time.sleep(2)  # workers go on; their reports wait for the manager
    cluster.start_manager()
    resumed = cluster.progress()
    assert resumed["status"] == "running"
    assert resumed["published"] < resumed["total"], "the manager was stopped after publishing everything"
    assert resumed["published"] >= before["published"]  # it resumes from its persisted cursor
    progress = cluster.wait_completed()
    cluster.assert_no_loss(progress)
    # the first pass published each sample once: the new manager went on from the cursor, skipping none
    assert progress["published"] - progress["republished"] == progress["total"]


def test_corrupt_file_fails_alone(make_cluster, rabbitmq_url: str) -> None:
    cluster = make_cluster(rabbitmq_url, tones=16)
    bad = cluster.data / "high" / "tone_05.wav"
    bad.write_bytes(b"RIFF\x00\x00\x00\x00WAVEfmt " + b"\x07" * 300)
    cluster.start(workers=2)
    progress = cluster.wait_completed()
    cluster.assert_no_loss(progress, failed=3)  # one clip, three transformations
    failures = cluster.client.failures(cluster.session_id)
    assert sorted(f["sample_id"] for f in failures) == [f"high/tone_05.wav#{i}" for i in range(3)]
    for failure in failures:
        assert "AudioError" in failure["reason"] and "tone_05.wav" in failure["reason"], failure
