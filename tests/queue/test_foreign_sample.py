"""Workers compute only the samples of their experiment: a message names a clip of its dataset and one of its
transformations by index, and must describe that sample exactly; any other fails with a reason, not computed.
The check on real files, then through real ``labswarm worker`` processes, a real manager and RabbitMQ."""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import experiment_dict, write_dataset, write_tone

from labswarm.config.experiment import parse_experiment
from labswarm.deploy.local import LocalLauncher
from labswarm.pipeline.features import FeaturesBlock
from labswarm.sample import ExperimentSamples, ForeignSample, iter_samples
from labswarm.sessions.broker import BrokerClient
from labswarm.store import FeatureStore


def test_the_experiments_own_samples_are_verified_and_nothing_else(tmp_path: Path) -> None:
    config = parse_experiment(experiment_dict(write_dataset(tmp_path / "data"), tmp_path / "store"))
    assert len(config.transformations) == 2
    samples = ExperimentSamples(config, reread_after=0.0)
    own = list(iter_samples(config))
    for sample in own:  # as a message carries it: JSON
        assert samples.verified(json.loads(json.dumps(sample.to_dict()))) == sample
    first = own[0].to_dict()
    write_tone(tmp_path / "outside.wav")
    forged = {
        "a path outside the dataset": {**first, "path": str(tmp_path / "outside.wav")},
        "a transformation not in the experiment": {**first, "transformation": {"name": "gain", "gain_db": 7.0}},
        "another seed": {**first, "seed": first["seed"] + 1},
        "another label": {**first, "label": "other"},
        "an unknown field": {**first, "exec": "rm -rf /"},
        "a missing field": {k: v for k, v in first.items() if k != "transformation"},
        "no clip of the dataset": {**first, "id": "../../etc/passwd#0", "path": "/etc/passwd"},
        "a transformation index out of range": {**first, "id": first["id"].replace("#0", "#2")},
        "a padded index": {**first, "id": first["id"].replace("#0", "#00")},
        "a non-ASCII digit": {**first, "id": first["id"].replace("#0", "#\u0660")},
        "no index": {**first, "id": first["id"].replace("#0", "")},
        "an id that is no string": {**first, "id": 7},
    }
    for what, data in forged.items():
        with pytest.raises(ForeignSample):
            samples.verified(data)
            pytest.fail(f"{what}: accepted")
    # a clip added to the labels CSV since the worker read it is found (read again, at most every reread_after s)
    write_tone(tmp_path / "data" / "new.wav")
    with (tmp_path / "data" / "labels.csv").open("a") as handle:
        handle.write("new.wav,low,new\n")
    added = [s for s in iter_samples(config) if s.id.startswith("new.wav#")]
    assert added and samples.verified(added[0].to_dict()) == added[0]


@pytest.mark.slow
def test_a_forged_message_fails_its_sample_with_a_reason_through_a_real_worker(make_cluster,
                                                                                rabbitmq_url: str) -> None:
    cluster = make_cluster(rabbitmq_url, tones=2)  # 6 samples
    # no reconciliation during the test: a sample whose message was taken away stays pending
    cluster.settings = cluster.settings.model_copy(update={"reconcile_after": 600.0})
    cluster.start_manager()
    cluster.client.post_experiment(cluster.config.model_dump(mode="json"))
    cluster.session_id = cluster.client.start_session(cluster.name, 50.0)["id"]
    # no worker yet: the session publishes its 6 samples (the start window is larger); take its messages away
    # and put forged ones of three of its samples in their place
    cluster.wait_for(lambda p: p["published"] == p["total"] == 6, "every sample published", 60)
    broker = BrokerClient(cluster.settings)
    try:
        broker.purge_queue(cluster.name)
        own = list(iter_samples(cluster.config))
        write_tone(cluster.tmp_path / "outside.wav", seconds=10.0)
        forged = [replace(own[0], path=str(cluster.tmp_path / "outside.wav")),
                  replace(own[1], transformation={"name": "gain", "gain_db": 7.0}),
                  replace(own[2], path="/etc/passwd")]
        assert broker.publish_many(cluster.session_id, cluster.name, forged, threading.Event(),
                                   fingerprint=cluster.config.fingerprint()) == 3
    finally:
        broker.close()
    cluster.launcher = LocalLauncher(cluster.name, cluster.url, broker_url=cluster.broker_url,
                                     log_dir=cluster.tmp_path / "logs", restart=None)
    cluster.launcher.start(1)
    progress = cluster.wait_for(lambda p: p["failed"] == 3, "the forged samples' outcomes", 120)
    assert progress["done"] == progress["cached"] == 0 and progress["pending"] == 3, progress
    failures = {f["sample_id"]: f["reason"] for f in cluster.client.failures(cluster.session_id)}
    assert sorted(failures) == sorted(s.id for s in forged), failures
    for sample in forged:
        reason = failures[sample.id]
        assert reason.startswith("ForeignSample") and "differ" in reason and "root:x" not in reason, reason
    assert "path" in failures[own[0].id] and "transformation" in failures[own[1].id]
    block = FeaturesBlock(cluster.config)
    for sample in [*forged, *own[:3]]:  # computed by no one, neither as forged nor as the experiment's own
        assert not block.is_cached(sample), sample.id
    assert not cluster.store_root.exists() or FeatureStore(cluster.store_root).stats().entries == 0
