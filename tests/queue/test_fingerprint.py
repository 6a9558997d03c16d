"""Workers compute a message with the configuration its session runs, or not at all: real manager, real
``labswarm worker`` processes, real RabbitMQ."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

from labswarm.config.experiment import parse_experiment
from labswarm.db import make_engine, make_sessionmaker
from labswarm.pipeline.features import FeaturesBlock
from labswarm.sample import iter_samples
from labswarm.sessions import ledger
from labswarm.sessions.broker import BrokerClient

pytestmark = pytest.mark.slow


def test_worker_refetches_a_registered_again_configuration_and_refuses_a_stale_one(make_cluster,
                                                                                    rabbitmq_url: str) -> None:
    cluster = make_cluster(rabbitmq_url, tones=4)
    old = cluster.config
    cluster.start_manager()
    cluster.client.post_experiment(old.model_dump(mode="json"))
    from labswarm.deploy.local import LocalLauncher

    cluster.launcher = LocalLauncher(cluster.name, cluster.url, broker_url=cluster.broker_url,
                                   log_dir=cluster.tmp_path / "logs")
    cluster.launcher.start(2)  # the workers fetch the configuration now: the old one
    for worker in cluster.launcher.processes:
        cluster.pool_processes(worker)
    # registered again (no session is active) with other features: workers hold the old configuration
    data = old.model_dump(mode="json")
    data["features"] = [{"name": "mel", "n_mels": 32}]
    new = parse_experiment(data)
    assert new.fingerprint() != old.fingerprint()
    cluster.config = new
    cluster.client.post_experiment(data)
    cluster.session_id = cluster.client.start_session(cluster.name, 50.0)["id"]
    progress = cluster.wait_completed()
    cluster.assert_no_loss(progress)
    # every sample was computed with the session's configuration: its features are in the store
    new_block, old_block = FeaturesBlock(new), FeaturesBlock(old)
    for sample in iter_samples(new):
        assert new_block.is_cached(sample), sample.id
        assert not old_block.is_cached(sample), sample.id

    # a message of the old configuration (a session of it, cancelled, whose message a worker gave back late):
    # the worker asks the manager, which has the new one: the sample fails with the reason, computed by neither
    stale = replace(next(iter_samples(new)), id="late/tone.wav#0", transformation={"name": "gain", "gain_db": 7.0})
    # its ledger row, as that session's publisher wrote it (outcomes of samples not in a session are refused)
    engine = make_engine(cluster.settings.resolved_database_url())
    try:
        with make_sessionmaker(engine)() as db:
            ledger.add_samples(db, cluster.session_id, [(stale.id, "published", None)])
            db.commit()
    finally:
        engine.dispose()
    broker = BrokerClient(cluster.settings)
    try:
        assert broker.publish_many(cluster.session_id, cluster.name, [stale], threading.Event(),
                                   fingerprint=old.fingerprint()) == 1
    finally:
        broker.close()
    deadline = time.monotonic() + 60
    while not (failures := cluster.client.failures(cluster.session_id)):
        if time.monotonic() > deadline:
            pytest.fail(f"no outcome for the stale message\n{cluster.logs()}")
        time.sleep(0.1)
    assert [f["sample_id"] for f in failures] == [stale.id]
    reason = failures[0]["reason"]
    assert "StaleConfiguration" in reason and old.fingerprint() in reason and new.fingerprint() in reason, reason
    assert not new_block.is_cached(stale) and not old_block.is_cached(stale)
