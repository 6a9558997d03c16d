"""A remote store's writes inside a batch (labswarm/store/uploads.py): sent by background threads while the writer
goes on, bounded in bytes, a failed one tried again (the store's retry policy), every one stored (or its failure
raised) by the batch's end; on the S3 test server."""

from __future__ import annotations

import io
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from helpers import wait_until
from jobs.conftest import S3Endpoint

from labswarm.errors import StoreError
from labswarm.store import FeatureStore
from labswarm.store import uploads as uploads_module

KEYS = [f"{i:02x}" * 20 for i in range(1, 6)]


def test_a_batch_uploads_in_the_background_bounded_retried_and_stores_all_by_its_end(
        s3_endpoint: S3Endpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = FeatureStore.open(tmp_path / "cache", remote=s3_endpoint.spec(prefix="features"), cache_bytes=1 << 30)
    reader = FeatureStore.open(tmp_path / "other", remote=s3_endpoint.spec(prefix="features"), cache_bytes=0)
    arrays = {key: np.full((64, 100), i, np.float32) for i, key in enumerate(KEYS)}
    buffer = io.BytesIO()
    np.save(buffer, arrays[KEYS[0]])
    size = len(buffer.getvalue())  # each array's .npy bytes
    monkeypatch.setattr(uploads_module, "UPLOAD_BYTES", 2 * size)  # two arrays held at most
    waits: list[float] = []  # the retries' backoff, recorded instead of slept
    monkeypatch.setattr(uploads_module, "time", SimpleNamespace(sleep=waits.append))
    release, sending, flaky, refused = threading.Event(), [], KEYS[3], KEYS[4]
    refusals = {flaky: 1, refused: 10**6}  # the flaky PUT refused once, the other on every attempt

    def hold(params: dict[str, Any], **_: Any) -> None:  # the upload threads' PUTs wait for the test
        sending.append(params["Key"])
        assert release.wait(60), "the test never released the uploads"
        key = params["Key"].rsplit("/", 1)[-1].removesuffix(".npy")
        if refusals.get(key):
            refusals[key] -= 1
            raise OSError("refused by the test")

    store.origin._s3.meta.events.register("before-parameter-build.s3.PutObject", hold)  # type: ignore[attr-defined]
    stored: list[str] = []
    progress: list[str] = []
    failure: list[BaseException] = []

    def write() -> None:
        try:
            with store.batch():
                for key, values in arrays.items():
                    store.put(key, values, stored=stored.append)
                    progress.append(key)
        except StoreError as exc:
            failure.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    wait_until(lambda: len(sending) == 2, "two uploads in flight")
    assert progress == KEYS[:2] and stored == []  # put() returned before its array was stored
    assert not reader.contains(KEYS[0])
    writer.join(0.5)
    assert writer.is_alive() and progress == KEYS[:2]  # the third waits for room: two arrays held at most
    release.set()
    writer.join(60)
    assert not writer.is_alive()
    # the batch ended once every upload was done: the flaky one stored by its second attempt (not counted failed),
    # the refused one raised after STORE_RETRIES attempts with the backoff doubled, its callback not called
    assert len(failure) == 1 and "1 of 5 arrays not stored" in str(failure[0]) and refused in str(failure[0])
    assert sorted(stored) == KEYS[:4]
    attempts = {key: sum(sent.endswith(f"{key}.npy") for sent in sending) for key in KEYS}
    assert attempts == {**dict.fromkeys(KEYS[:3], 1), flaky: 2, refused: uploads_module.STORE_RETRIES}
    delay = uploads_module.RETRY_DELAY
    assert sorted(waits) == sorted([delay] + [delay * 2**i for i in range(uploads_module.STORE_RETRIES - 1)])
    for key in KEYS[:4]:
        np.testing.assert_array_equal(reader.get(key), arrays[key])
    assert not reader.contains(refused)
    refusals.clear()
    with store.batch():  # the next batch of the same store, its threads reused, nothing left of the failure
        store.put(refused, arrays[refused])
    np.testing.assert_array_equal(reader.get(refused), arrays[refused])
