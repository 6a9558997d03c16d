"""The compute task's writes to a remote feature store (labswarm/queue/task.py) for a single-sample message, run by
a real Celery task (eager) over a real s3 store (moto's server on :9000): its arrays are uploaded by the store's
background threads inside the message's batch, its outcome reported only once they are stored; an upload failing on
every attempt leaves the message ``unstored``, without an outcome, for reconciliation to publish again; a store that
refuses the writes for good (its bucket gone) fails the samples at once, with its reason."""

from __future__ import annotations

import threading
from pathlib import Path

import botocore.exceptions
from celery import Celery
from helpers import experiment_dict, write_tone_set
from jobs.conftest import S3Endpoint, s3_url  # noqa: F401 - the fixture s3_endpoint needs
from jobs.conftest import s3_endpoint as s3_endpoint  # a fixture

from labswarm.config.experiment import parse_experiment
from labswarm.queue.names import TASK_NAME
from labswarm.queue.task import WorkerState, register, set_worker_state
from labswarm.sample import iter_samples
from labswarm.sessions.broker import _sample_dict
from labswarm.storage.cache import CachedStorage
from labswarm.store import uploads


def test_a_single_sample_message_is_stored_by_its_batch(tmp_path: Path, s3_endpoint: S3Endpoint,
                                                          monkeypatch) -> None:
    monkeypatch.setenv("LABSWARM_STORE_WRITE_PACKS", "0")  # an object per array: the PUTs counted below are arrays'
    # (a batch written as one pack: tests/store/test_written.py; the uploads' retries and refusals are the same)
    data = experiment_dict(write_tone_set(tmp_path / "data", 2, seconds=2.0), tmp_path / "cache", name="single")
    data["store"]["remote"] = s3_endpoint.spec(prefix="features")  # read through a cache in tmp_path / "cache"
    config = parse_experiment(data)
    first, second, third, fourth = [_sample_dict(s) for s in list(iter_samples(config))[:4]]
    state = WorkerState(configs={"single": config}, manager_url="http://127.0.0.1:9", report_interval=3600.0)
    set_worker_state(state)
    try:
        state.ensure()
        storage = state.blocks["single"].store.storage
        assert isinstance(storage, CachedStorage)
        reporter = state.outcomes
        reporter.stop()  # the outcomes stay queued, read below (its thread would send them meanwhile, to a dead port)
        puts: list[tuple[str, int]] = []  # (thread, outcomes reported by then) per PUT of an array
        refuse = threading.Event()

        def seen(params: dict, **_: object) -> None:
            if params["Key"].endswith(".npy"):
                puts.append((threading.current_thread().name, len(reporter._pending["s1"])))
                if refuse.is_set():
                    raise botocore.exceptions.EndpointConnectionError(endpoint_url=s3_endpoint.url)

        storage.remote._s3.meta.events.register("before-parameter-build.s3.PutObject", seen)  # type: ignore[attr-defined]
        app = Celery("single", broker="memory://")
        register(app)
        task = app.tasks[TASK_NAME]

        assert task.apply(args=("s1", first)).get() == "computed"
        assert len(puts) == 2 and all(t.startswith("store-upload") for t, _ in puts), puts  # both in background
        assert all(n == 0 for _, n in puts), puts  # no outcome before its arrays were stored
        assert [o["sample_id"] for o in reporter._pending["s1"]] == [first["id"]]
        stored = [k for k in s3_endpoint.objects() if k.endswith(".npy")]
        assert len(stored) == 2

        monkeypatch.setattr(uploads, "RETRY_DELAY", 0.01)  # the backoff between attempts, not what is tested
        refuse.set()
        puts.clear()
        assert task.apply(args=("s1", second)).get() == "unstored"
        assert len(puts) == 2 * uploads.STORE_RETRIES, puts  # each array tried again, then given up
        assert [o["sample_id"] for o in reporter._pending["s1"]] == [first["id"]]  # no outcome: republished later
        assert [k for k in s3_endpoint.objects() if k.endswith(".npy")] == stored

        # the bucket gone (NoSuchBucket: as refused credentials, trying again changes nothing): each array tried
        # once, the samples fail at once with the store's reason, a single-sample message and a multi-sample one
        # alike (before, 'unstored' and published again until out of attempts, then failed as lost)
        refuse.clear()
        puts.clear()
        for key in s3_endpoint.objects():
            s3_endpoint.client.delete_object(Bucket=s3_endpoint.bucket, Key=key)
        s3_endpoint.client.delete_bucket(Bucket=s3_endpoint.bucket)
        assert task.apply(args=("s1", second)).get() == "failed"
        assert task.apply(args=("s1", [third, fourth])).get() == "failed,failed"
        assert len(puts) == 6, puts  # 2 arrays x 3 samples, none tried again
        outcomes = reporter._pending["s1"]
        assert [o["sample_id"] for o in outcomes] == [s["id"] for s in (first, second, third, fourth)]
        assert all(o["status"] == "failed" and o["reason"].startswith("StoreRefused: ")
                   and f"no bucket {s3_endpoint.bucket!r}" in o["reason"] for o in outcomes[1:]), outcomes
    finally:
        set_worker_state(None)
        state.close()
        if s3_endpoint.bucket not in [b["Name"] for b in s3_endpoint.client.list_buckets()["Buckets"]]:
            s3_endpoint.client.create_bucket(Bucket=s3_endpoint.bucket)  # the fixture empties and deletes it
