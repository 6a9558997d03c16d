"""One worker can serve several experiments: it consumes each one's queue and computes each message with the
features block of the experiment whose queue it came from (real RabbitMQ, real processes)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from helpers import SR, delete_queue, experiment_dict, write_tone_set

from labswarm.client import ManagerClient
from labswarm.config.experiment import parse_experiment
from labswarm.deploy.local import LocalLauncher
from labswarm.manager.api import create_app
from labswarm.manager.server import EmbeddedServer
from labswarm.queue.app import queue_name
from labswarm.settings import Settings
from labswarm.store import FeatureStore

pytestmark = pytest.mark.slow


def test_one_worker_two_experiments(rabbitmq_url: str, tmp_path: Path) -> None:
    data = write_tone_set(tmp_path / "data", tones=6, seconds=2.0)
    names = [f"a-{uuid.uuid4().hex[:8]}", f"b-{uuid.uuid4().hex[:8]}"]
    # different features, so each experiment's samples have keys of their own in the shared store
    features = {names[0]: [{"name": "mel", "n_mels": 32}], names[1]: [{"name": "mfcc", "n_mfcc": 13}]}
    settings = Settings(home=tmp_path / "home", broker_url=rabbitmq_url, reconcile_after=2.0)
    server = EmbeddedServer(create_app(settings)).start()
    launcher = None
    try:
        with ManagerClient(server.url) as client:
            for name in names:
                config = parse_experiment(experiment_dict(
                    data, tmp_path / "store", name=name,
                    dataset={"root": str(data), "sample_rate": SR, "segment": {"start": 0.0, "duration": 2.0}},
                    transformations=[{"name": "identity"}, {"name": "gain", "gain_db": -3.0}],
                    features=features[name]))
                client.post_experiment(config.model_dump(mode="json"))
            sessions = [client.start_session(name, 50.0)["id"] for name in names]
            launcher = LocalLauncher(names, server.url, broker_url=rabbitmq_url, log_dir=tmp_path / "logs")
            launcher.start(1)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                progress = [client.session(s) for s in sessions]
                if all(p["status"] == "completed" for p in progress):
                    break
                time.sleep(0.2)
            assert [p["status"] for p in progress] == ["completed", "completed"], progress
            assert [p["done"] for p in progress] == [12, 12]
        # each experiment's outputs, computed by the one worker, are in the store: 12 mel + 12 MFCC arrays
        shapes = sorted({FeatureStore(tmp_path / "store").get(p.stem).shape[0]
                         for p in (tmp_path / "store").rglob("*.npy")})
        assert shapes == [13, 32]
        assert FeatureStore(tmp_path / "store").stats().entries == 24
    finally:
        if launcher is not None:
            launcher.stop(15)
        server.stop()
        for name in names:
            delete_queue(rabbitmq_url, queue_name(name))
