"""Samples per message chosen by the publisher from the measured task time (issue 27, item 1): the rule, and on
the real RabbitMQ with a real worker, a poison sample packed with tiny ones fails alone while each of its batch
mates is done once (computed once, or twice for those packed before it in its message, whose arrays die
unplaced with it)."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import delete_queue, missing, write_tone
from sqlalchemy import select

from labswarm.client import ManagerClient
from labswarm.config.experiment import parse_experiment
from labswarm.deploy.local import LocalLauncher
from labswarm.manager.api import create_app
from labswarm.manager.server import EmbeddedServer, free_port
from labswarm.queue.app import queue_name
from labswarm.sample import iter_samples
from labswarm.sessions.models import SampleRow
from labswarm.sessions.packing import MAX_SAMPLES, TARGET_SECONDS, MessagePacking
from labswarm.settings import Settings
from labswarm.store import FeatureStore

RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672//"

#: Imported by every worker process (on PYTHONPATH): the sample POISON_SAMPLE_ID kills the pool process that
#: computes it (``os._exit``), every time; every sample a worker computes (not found in the store) is appended to
#: the file POISON_LOG names.
SITECUSTOMIZE = '''
import os
if os.environ.get("POISON_SAMPLE_ID"):
    from labswarm.pipeline import features

    _process = features.FeaturesBlock.process

    def process(self, sample):
        if sample.id == os.environ["POISON_SAMPLE_ID"]:
            os._exit(1)
        result = _process(self, sample)
        if result.status == "computed":
            with open(os.environ["POISON_LOG"], "a") as log:  # one short append per call: lines stay whole
                log.write(sample.id + "\\n")
        return result

    features.FeaturesBlock.process = process
'''


def test_tiny_tasks_are_packed_long_ones_travel_alone_and_a_setting_fixes_it() -> None:
    packing = MessagePacking()
    assert packing.size() == 1  # nothing measured: a task may be long
    task = TARGET_SECONDS / 12.5  # a task time that packs 12 (0.04 s at a target of 0.5 s)
    packing.observe(seconds=task * 50, count=50)
    assert packing.size() == int(TARGET_SECONDS / task) == 12
    packing.observe(seconds=0.0, count=10)  # found in the store: the mean goes down, the size up to its bound
    assert 12 < packing.size() <= MAX_SAMPLES
    packing.observe(seconds=TARGET_SECONDS * 0.6 * 50, count=50)  # a task of more than half the target: alone
    for _ in range(40):
        packing.observe(seconds=TARGET_SECONDS * 0.6 * 5, count=5)
    assert packing.size() == 1
    for _ in range(40):  # the tasks became long: back to one a message
        packing.observe(seconds=2.0 * 5, count=5)
    assert packing.size() == 1
    packing.observe(seconds=float("nan"), count=3)  # nonsense is ignored
    packing.observe(seconds=1.0, count=0)
    assert packing.size() == 1
    fixed = MessagePacking(4)
    fixed.observe(seconds=0.001, count=100)
    assert fixed.size() == 4
    with pytest.raises(ValueError, match="samples_per_message"):
        MessagePacking(0)


def wait_until(condition: Callable[[], Any], what: str, timeout: float, logs: Path) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            text = "\n".join(p.read_text(errors="replace")[-3000:] for p in sorted(logs.glob("*")))
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}\n{text}")
        time.sleep(0.2)
    return value


@pytest.mark.slow  # a worker and ~200 tiny samples on the real RabbitMQ, a pool process killed (~60 s at load 8)
def test_a_poison_sample_packed_with_tiny_ones_fails_alone_and_its_mates_are_done_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kombu import Connection

    try:
        with Connection(RABBITMQ_URL, connect_timeout=3) as conn:
            conn.ensure_connection(max_retries=1)
    except Exception as exc:
        missing(f"RabbitMQ is not reachable at {RABBITMQ_URL} ({type(exc).__name__}: {exc})")
    data = tmp_path / "data"
    # tiny tasks even on a loaded machine: 0.1 s clips, a small mel, the store in memory where there is one
    shm = Path("/dev/shm")
    store = Path(tempfile.mkdtemp(prefix="labswarm-packing-", dir=shm)) if shm.is_dir() else tmp_path / "store"
    rows = ["path,label"]
    for i in range(200):
        write_tone(data / f"t{i:03d}.wav", freq=200.0 + 5 * i, seconds=0.1, seed=i)
        rows.append(f"t{i:03d}.wav,{'ab'[i % 2]}")
    (data / "labels.csv").write_text("\n".join(rows) + "\n")
    name = f"pack-{uuid.uuid4().hex[:8]}"
    config = {"name": name, "dataset": {"root": str(data), "segment": {"start": 0.0, "duration": 0.1}},
              "transformations": [{"name": "identity"}], "features": [{"name": "mel", "n_mels": 16}],
              "store": {"root": str(store)}}
    ids = [s.id for s in iter_samples(parse_experiment(config))]
    poison = ids[150]  # late: by then the publisher has measured tiny tasks and packs them
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(hooks), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("POISON_SAMPLE_ID", poison)
    monkeypatch.setenv("POISON_LOG", str(tmp_path / "computed.txt"))
    settings = Settings(home=tmp_path / "home", broker_url=RABBITMQ_URL, data_roots=[tmp_path, store],
                        max_attempts=2, reconcile_after=2.0)
    assert settings.samples_per_message is None  # the default: the publisher chooses
    port = free_port()
    app = create_app(settings)
    server = EmbeddedServer(app, port=port).start()
    client = ManagerClient(server.url, timeout=30.0)
    logs = tmp_path / "logs"
    launcher = LocalLauncher(name, server.url, broker_url=RABBITMQ_URL, log_dir=logs, restart=None)
    try:
        client.post_experiment(config)
        launcher.start(1)
        session_id = client.start_session(name)["id"]
        sizes = []  # the samples per message the publisher chose while it ran
        runner = app.state.sessions._runners.get(session_id)

        def ended() -> dict | None:
            if runner is not None:
                sizes.append(runner.packing.size())
            return (p := client.session(session_id))["status"] in ("completed", "failed", "cancelled") and p

        progress = wait_until(ended, "the end of the session", 240, logs)
        failures = client.failures(session_id)
        with app.state.sessions.db() as db:
            attempts = dict(db.execute(select(SampleRow.sample_id, SampleRow.attempts)
                                       .where(SampleRow.session_id == session_id)).all())
    finally:
        launcher.stop(timeout=15.0)
        server.stop()
        client.close()
        delete_queue(RABBITMQ_URL, queue_name(name))
        entries = FeatureStore(store).stats().entries
        shutil.rmtree(store, ignore_errors=True)
    assert max(sizes) > 1, sizes  # tiny tasks were packed
    worker_log = "\n".join(p.read_text(errors="replace") for p in sorted(logs.glob("*")))
    split = re.search(r"message \S+ of (\d+) samples came back \(its worker was lost\): split", worker_log)
    assert split and int(split.group(1)) > 1, worker_log[-3000:]  # the poison was in a message with mates
    print(f"samples per message chosen: {sorted(set(sizes))}; the poison's message held {split.group(1)}")
    assert progress["status"] == "completed", progress
    assert [f["sample_id"] for f in failures] == [poison], failures
    assert progress["failed"] == 1 and progress["done"] + progress["cached"] == len(ids) - 1, progress
    mates = [i for i in ids if i != poison]
    assert {attempts[i] for i in mates} == {1}  # not charged for the poison's crash
    computed = Counter((tmp_path / "computed.txt").read_text().split())
    assert set(computed) == set(mates), set(mates) ^ set(computed)  # every mate computed, the poison never whole
    # a message's arrays are placed at its end, after one sync (FeatureStore.batch): the mates computed before the
    # poison in its message died unplaced with the pool process and were computed again, once, after the split;
    # every other sample was computed once
    again = sorted(sample for sample, n in computed.items() if n > 1)
    assert max(computed.values()) <= 2, computed.most_common(3)
    assert len(again) < int(split.group(1)), (again, split.group(1))
    assert all(ids.index(poison) - int(split.group(1)) < ids.index(sample) < ids.index(poison) for sample in again), \
        (again, poison)
    assert entries == len(mates)
