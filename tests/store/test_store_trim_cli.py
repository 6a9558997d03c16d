"""``labswarm store trim`` against a real manager (embedded, over HTTP, sessions on the local RabbitMQ): a local
store under a size limit, least recently used arrays first, never an array of a running session's experiment."""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from pathlib import Path

import numpy as np
import pytest
from helpers import delete_queue, experiment_dict, write_dataset
from test_store_cli import ORPHANS, TOKEN, compute, runner  # noqa: F401 - the CLI runner fixture
from typer.testing import CliRunner

from labswarm.cli.main import app
from labswarm.client import ManagerClient
from labswarm.config.experiment import ExperimentConfig
from labswarm.errors import ManagerError
from labswarm.manager.api import create_app
from labswarm.manager.server import EmbeddedServer
from labswarm.queue.app import queue_name
from labswarm.settings import Settings
from labswarm.store import FeatureStore

RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672//"


@pytest.mark.slow  # ~22 s: computes two experiments, a manager with a session on RabbitMQ
def test_trim_keeps_a_running_sessions_arrays_and_removes_the_least_recently_used(runner: CliRunner,  # noqa: F811
                                                                                  tmp_path: Path) -> None:
    from sessions.test_follow import rabbitmq

    rabbitmq()
    dataset = write_dataset(tmp_path / "data", n_per_label=2)
    store = tmp_path / "store"
    name = f"trim-{uuid.uuid4().hex[:8]}"
    specs = {name: experiment_dict(dataset, store, name=name),
             "idle": experiment_dict(dataset, store, name="idle", features=[{"name": "mel", "n_mels": 16}])}
    keys = {n: compute(ExperimentConfig.model_validate(spec)) for n, spec in specs.items()}
    feature_store = FeatureStore(store)
    for key in ORPHANS:
        feature_store.put(key, np.ones((4, 4), np.float32))
    for key in keys[name]:  # the session's arrays are the least recently used: first to go were they not in use
        os.utime(feature_store.storage.local_path(feature_store.relpath(key)), (1_000_000, 1_000_000))
    for i, key in enumerate(ORPHANS):  # then the orphans, then the idle experiment's (written just now)
        os.utime(feature_store.storage.local_path(feature_store.relpath(key)), (2_000_000 + i, 2_000_000 + i))
    sizes = feature_store.sizes()
    in_use = sum(sizes[k] for k in keys[name])
    settings = Settings(home=tmp_path / "home", api_token=TOKEN, broker_url=RABBITMQ_URL, data_roots=[tmp_path],
                        reconcile_after=600.0)
    with EmbeddedServer(create_app(settings)) as server, ManagerClient(server.url, TOKEN) as client:
        try:
            for spec in specs.values():
                client.post_experiment(spec)
            session = client.start_session(name, 0.5, follow=True)["id"]  # following its labels: stays running
            args = ["store", "trim", "--store", str(store), "--manager", server.url, "--json"]
            # a limit the orphans' removal meets: only they go, oldest first
            limit = sum(sizes.values()) - sum(sizes[k] for k in ORPHANS[:2])
            dry = runner.invoke(app, [*args, "--max-bytes", str(limit), "--dry-run"])
            assert dry.exit_code == 0, dry.output
            assert json.loads(dry.output)["arrays"] == 2 and len(feature_store.sizes()) == len(sizes)
            done = runner.invoke(app, [*args, "--max-bytes", str(limit)])
            assert done.exit_code == 0 and json.loads(done.output)["users"] == [f"session {session}"], done.output
            assert sorted(set(sizes) - set(feature_store.sizes())) == sorted(ORPHANS[:2])
            # a limit of 0: everything else goes, the session's arrays stay (exit 1: still over the limit)
            over = runner.invoke(app, [*args, "--max-bytes", "0"])
            assert over.exit_code == 1 and "in use alone exceed the limit" in over.output  # the warning, then JSON
            assert json.loads(over.output[over.output.index("{"):])["protected"] == in_use
            assert set(feature_store.sizes()) == keys[name]
            bad = runner.invoke(app, [*args, "--max-bytes", "lots"])
            assert bad.exit_code == 2 and "--max-bytes" in bad.output
        finally:
            with contextlib.suppress(ManagerError, UnboundLocalError):
                client.cancel(session)
            delete_queue(RABBITMQ_URL, queue_name(name))
