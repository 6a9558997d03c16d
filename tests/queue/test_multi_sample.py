"""Several samples per message (``samples_per_message``), on a real RabbitMQ: the message format, the queue bound
in samples, and a poison sample in a multi-sample message that fails alone once the message is split."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import delete_queue
from kombu import Connection

from labswarm.queue.app import message_bound, queue_name
from labswarm.sample import Sample, iter_samples
from labswarm.sessions.broker import BrokerClient
from labswarm.settings import Settings

#: Imported by every worker process (on PYTHONPATH): the sample named by POISON_SAMPLE_ID kills the pool process
#: that computes it (``os._exit``), every time, as a segfaulting decoder or the kernel's OOM killer would; every
#: sample a worker starts is appended to the file POISON_LOG names.
SITECUSTOMIZE = '''
import os
if os.environ.get("POISON_SAMPLE_ID"):
    from labswarm.pipeline import features

    _process = features.FeaturesBlock.process

    def process(self, sample):
        with open(os.environ["POISON_LOG"], "a") as log:  # one short append per call: lines stay whole
            log.write(sample.id + "\\n")
        if sample.id == os.environ["POISON_SAMPLE_ID"]:
            os._exit(1)
        return _process(self, sample)

    features.FeaturesBlock.process = process
'''


@pytest.fixture
def experiment(rabbitmq_url: str) -> Iterator[str]:
    """A unique experiment name whose queue is deleted after the test."""
    name = f"m-{uuid.uuid4().hex[:10]}"
    yield name
    delete_queue(rabbitmq_url, queue_name(name))


def _samples(n: int) -> list[Sample]:
    return [Sample(id=f"c{i}#0", path=f"/data/c{i}.wav", label="a", source=f"s{i}", start=0.0, duration=1.0,
                   transformation={"name": "identity"}, seed=i) for i in range(n)]


def _drain(url: str, experiment: str) -> list[list]:
    """The args of every message waiting in the experiment's queue (taken and acknowledged), in order."""
    out = []
    with Connection(url) as conn:
        channel = conn.default_channel
        while (raw := channel.basic_get(queue_name(experiment), no_ack=True)) is not None:
            out.append(channel.message_to_python(raw).decode()[0])
    return out


def test_message_bound_counts_samples() -> None:
    assert message_bound(10_000, 1) == 10_000
    assert message_bound(10_000, 8) == 1_250
    assert message_bound(10, 4) == 3  # rounded up: the bound in samples holds to within one message
    assert message_bound(None, 8) is None and message_bound(0, 8) == 0


@pytest.mark.parametrize("per_message, sizes", [(1, [1] * 10), (4, [4, 4, 2])])
def test_publish_many_packs_samples(tmp_path: Path, rabbitmq_url: str, experiment: str, per_message: int,
                                    sizes: list[int]) -> None:
    client = BrokerClient(Settings(home=tmp_path, broker_url=rabbitmq_url, samples_per_message=per_message,
                                   max_queue_length=10))
    try:
        client.declare_queue(experiment)
        batch = _samples(10)
        assert client.publish_many("sess1", experiment, batch, threading.Event(), fingerprint="f00d") == 10
        assert client.queue_depth(experiment) == len(sizes)
    finally:
        client.close()
    args = _drain(rabbitmq_url, experiment)
    if per_message == 1:  # today's format, unchanged: (session_id, sample)
        assert [a[1]["id"] for a in args] == [s.id for s in batch] and args[0] == ["sess1", batch[0].to_dict()]
    else:
        assert [len(a[1]) for a in args] == sizes
        assert [s["id"] for a in args for s in a[1]] == [s.id for s in batch]
        assert args[0][1][0] == batch[0].to_dict()


@pytest.mark.slow
def test_poison_sample_in_a_multi_sample_message_fails_alone(make_cluster, rabbitmq_url: str, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = make_cluster(rabbitmq_url, tones=4)  # 12 samples: 3 messages of 4
    # reconciliation after 10 s without an outcome (the default; the cluster's 2 s): with 2 attempts a sample, two
    # 2-s lulls on a loaded machine (a pool process killed by the poison and forked again while the mates' single
    # messages wait, unacknowledged, in its worker) failed the mates as lost while they were in flight (4 failed
    # of 12, 3 of 7 runs at load 8-10)
    cluster.settings = cluster.settings.model_copy(update={"samples_per_message": 4, "max_attempts": 2,
                                                           "reconcile_after": 10.0})
    ids = [s.id for s in iter_samples(cluster.config)]
    poison = ids[5]  # second message, with innocent samples before and after it
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(hooks), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("POISON_SAMPLE_ID", poison)
    monkeypatch.setenv("POISON_LOG", str(tmp_path / "computed.txt"))
    cluster.start(workers=2)
    progress = cluster.wait_completed()
    cluster.assert_no_loss(progress, failed=1)
    failures = cluster.client.failures(cluster.session_id)
    assert [f["sample_id"] for f in failures] == [poison]
    assert "worker lost" in failures[0]["reason"], failures
    # its own deliveries, counted from the split on: failed by the redelivery past max_attempts (2), or by
    # reconciliation when it runs first (its last message given back while its worker restarts)
    assert failures[0]["attempts"] >= 2, failures
    # its mates: none failed; a mate computed before the crash had its arrays stored but its outcome not reported,
    # so its redelivery (alone, after the split) finds them: cached, not computed again (the store holds each once)
    assert progress["done"] + progress["cached"] == len(ids) - 1 and progress["cached"] <= 3, progress
    computed = (tmp_path / "computed.txt").read_text().split()
    assert computed.count(poison) >= 2  # in its message of 4, then alone after the split
