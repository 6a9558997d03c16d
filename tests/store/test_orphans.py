"""The written packs' orphans (labswarm/store/orphans.py) on s3 (moto's server on :9000): a worker killed between a
pack's PUT and its index's leaves no index naming a missing pack, only an orphan that verify reports and gc removes
once it is ORPHAN_S old, and a redelivery writes the pack again; gc never removes the pack a redelivery writes again
in the moment it removes its orphan."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest
from helpers import wait_until
from jobs.conftest import S3Endpoint
from test_written import PREFIX, _message, _write

from labswarm.storage.base import Storage
from labswarm.store import FeatureStore
from labswarm.store import orphans as orphans_module
from labswarm.store.ops import collect_garbage, verify
from labswarm.store.orphans import find_orphans, remove_orphans
from labswarm.store.packs import list_packs
from labswarm.store.written import WRITTEN


def _killed_between(spec: dict, arrays: dict[str, np.ndarray], ready: str) -> None:
    """Write ``arrays`` as a message, stopping for good once the pack's PUT is done and before its index's."""
    store = FeatureStore.open("/nonexistent-unused", remote=spec, cache_bytes=0, packed=True)
    origin: Storage = store.origin
    put = origin.put_bytes

    def put_then_stop(key: str, data: bytes) -> None:
        put(key, data)
        if key.endswith(".pack"):
            Path(ready).write_text(key)
            signal.pause()  # killed -9 here

    origin.put_bytes = put_then_stop  # type: ignore[method-assign]
    _write(store, arrays)
    os._exit(3)  # not reached


def test_a_worker_killed_mid_upload_leaves_no_index_of_a_missing_pack(tmp_path: Path, s3_endpoint: S3Endpoint,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    spec = s3_endpoint.spec(prefix=PREFIX)
    arrays = _message(1)
    ready = tmp_path / "ready"
    # spawned, not forked: a child forked from pytest's process could inherit a lock another test's thread held
    child = multiprocessing.get_context("spawn").Process(target=_killed_between, args=(spec, arrays, str(ready)))
    child.start()
    try:
        wait_until(lambda: ready.exists() or not child.is_alive(),
                   "the child's pack PUT (the child alive, stuck before it)", timeout=120, interval=0.05)
        assert ready.exists(), f"the child ended before its pack's PUT: exit code {child.exitcode}"
    finally:
        child.kill()  # SIGKILL, while it runs (not a pid it no longer has)
    child.join(60)
    assert child.exitcode == -signal.SIGKILL
    store = FeatureStore.open(tmp_path / "cache", remote=spec, cache_bytes=1 << 30, packed=True)
    objects = s3_endpoint.objects()
    packs = [o for o in objects if o.endswith(".pack")]
    indexes = [o for o in objects if o.endswith(".json") and o.startswith(f"{PREFIX}/{WRITTEN}/")]
    assert len(packs) == 1 and indexes == []  # the pack PUT, no index: nothing names it
    assert not any(store.contains(k) for k in arrays) and store.sizes() == {}
    assert verify(store).problems == {}  # an orphan, but a young one: maybe a write in progress
    assert store.written is not None and find_orphans(store.origin, 0.0) == {packs[0][len(PREFIX) + 1:]: mock.ANY}
    stray = f"{WRITTEN}/{'e' * 64}.json"  # and an index whose pack is gone
    store.origin.put_bytes(stray, b"[]")
    assert collect_garbage(store, {"e": {"m": ["3" * 40]}}).orphans == 0  # younger than ORPHAN_S: kept
    monkeypatch.setattr(orphans_module, "ORPHAN_S", 0.0)  # as if an hour had passed
    assert set(verify(store).problems) == {f"orphan {packs[0][len(PREFIX) + 1:]}", f"orphan {stray}"}
    assert collect_garbage(store, {"e": {"m": ["3" * 40]}}).orphans == 2
    assert [o for o in s3_endpoint.objects() if o.startswith(f"{PREFIX}/{WRITTEN}/")] == []
    # the message redelivered: the same pack (its name is its header's hash), now with its index
    assert sorted(_write(store, arrays)) == sorted(arrays)
    assert [o for o in s3_endpoint.objects() if o.endswith(".pack")] == packs  # written again
    assert list(list_packs(store.origin, WRITTEN)) == [packs[0].rsplit("/", 1)[1][:-5]]
    for key, array in arrays.items():
        np.testing.assert_array_equal(FeatureStore.open(tmp_path / "c2", remote=spec, cache_bytes=0).get(key), array)


def test_gc_keeps_the_pack_a_redelivery_writes_again_while_it_removes_its_orphan(tmp_path: Path,
                                                                                 s3_endpoint: S3Endpoint) -> None:
    spec = s3_endpoint.spec(prefix=PREFIX)
    arrays = _message(5, samples=1)  # a single-sample message: redelivered, it writes the same pack
    _write(FeatureStore.open(tmp_path / "w1", remote=spec, cache_bytes=0, packed=True), arrays)
    [index] = [o for o in s3_endpoint.objects() if o.endswith(".json") and f"/{WRITTEN}/" in o]
    s3_endpoint.client.delete_object(Bucket=s3_endpoint.bucket, Key=index)  # as if killed before the index's PUT
    gc = FeatureStore.open(tmp_path / "gc", remote=spec, cache_bytes=0).origin
    orphans = find_orphans(gc, 0.0)  # gc's listing: the pack, an orphan (as if an hour old)
    assert [k[-5:] for k in orphans] == [".pack"]
    # the redelivery: a real writer in another thread, held between its pack's PUT and its index's
    writer = FeatureStore.open(tmp_path / "w2", remote=spec, cache_bytes=0, packed=True)
    assert writer.written is not None
    origin: Storage = writer.written.origin
    put, pack_put, go, stored = origin.put_bytes, threading.Event(), threading.Event(), []

    def put_and_hold(key: str, data: bytes) -> None:
        put(key, data)
        if key.endswith(".pack"):
            pack_put.set()
            assert go.wait(120), "the test never let the index's PUT go"

    origin.put_bytes = put_and_hold  # type: ignore[method-assign]
    thread = threading.Thread(target=lambda: stored.extend(_write(writer, arrays)))
    thread.start()
    try:
        assert pack_put.wait(120), "the redelivery's pack PUT never came"
        assert remove_orphans(gc, orphans) == []  # its index not there yet, but the pack is another write now
    finally:
        go.set()
        thread.join(120)
    assert not thread.is_alive() and sorted(stored) == sorted(arrays)
    reader = FeatureStore.open(tmp_path / "r", remote=spec, cache_bytes=0)
    for key, array in arrays.items():
        np.testing.assert_array_equal(reader.get(key), array)
    assert find_orphans(gc, 0.0) == {}


def test_gc_leaves_the_orphans_when_the_server_ignores_conditional_deletes(tmp_path: Path, s3_endpoint: S3Endpoint,
                                                                           monkeypatch: pytest.MonkeyPatch,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    """A server that ignores If-Match on DeleteObject (here: moto, the client's If-Match dropped before it is sent)
    would make each orphan's removal unconditional: gc probes it once and leaves the orphans with a warning naming
    the server (review #2); the same store with the header sent removes them."""
    spec = s3_endpoint.spec(prefix=PREFIX)
    _write(FeatureStore.open(tmp_path / "w", remote=spec, cache_bytes=0, packed=True), _message(8, samples=1))
    [index] = [o for o in s3_endpoint.objects() if o.endswith(".json") and f"/{WRITTEN}/" in o]
    s3_endpoint.client.delete_object(Bucket=s3_endpoint.bucket, Key=index)  # an orphan pack
    monkeypatch.setattr(orphans_module, "ORPHAN_S", 0.0)  # as if an hour old
    store = FeatureStore.open(tmp_path / "gc", remote=spec, cache_bytes=0)
    deletes: list[str] = []

    def drop_if_match(request: Any, **_: Any) -> None:
        deletes.append(request.headers.get("If-Match", ""))
        del request.headers["If-Match"]

    store.origin._s3.meta.events.register("before-sign.s3.DeleteObject", drop_if_match)
    with caplog.at_level("WARNING", logger="labswarm.store.orphans"):
        assert collect_garbage(store, {"exp": {"mfcc": []}}).orphans == 0
    assert len(deletes) == 1  # the probe's, not the orphan's
    assert "ignores conditional deletes" in caplog.text and "127.0.0.1:9000" in caplog.text
    pack = [o for o in s3_endpoint.objects() if o.endswith(".pack")]
    assert len(pack) == 1 and not [o for o in s3_endpoint.objects() if "gc-probe" in o]  # the probe's object gone
    store.origin._s3.meta.events.unregister("before-sign.s3.DeleteObject", drop_if_match)
    assert collect_garbage(store, {"exp": {"mfcc": []}}).orphans == 1
    assert [o for o in s3_endpoint.objects() if f"/{WRITTEN}/" in o] == []


def test_gc_leaves_the_orphans_when_the_server_refuses_conditional_deletes(tmp_path: Path, s3_endpoint: S3Endpoint,
                                                                           monkeypatch: pytest.MonkeyPatch,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    """A server that answers an error (501 Not Implemented) to DeleteObject with If-Match: gc leaves the orphans
    with a warning naming the server and its answer, and the rest of gc is done (was: StoreError, the whole gc
    failed after removing entries). A probe's scratch object left by a gc that died mid-probe is removed by the
    next probe once over ORPHAN_S old (rev2 #5)."""
    from botocore.awsrequest import AWSResponse

    spec = s3_endpoint.spec(prefix=PREFIX)
    _write(FeatureStore.open(tmp_path / "w", remote=spec, cache_bytes=0, packed=True), _message(8, samples=1))
    [index] = [o for o in s3_endpoint.objects() if o.endswith(".json") and f"/{WRITTEN}/" in o]
    s3_endpoint.client.delete_object(Bucket=s3_endpoint.bucket, Key=index)  # an orphan pack
    monkeypatch.setattr(orphans_module, "ORPHAN_S", 0.0)  # as if an hour old
    store = FeatureStore.open(tmp_path / "gc", remote=spec, cache_bytes=0)
    store.origin.put_bytes(f"{orphans_module.PROBE}/left-by-a-dead-gc", b"x")
    refused: list[str] = []

    class Body:
        def stream(self, **_: Any) -> Any:
            yield b"<Error><Code>NotImplemented</Code><Message>If-Match on DeleteObject</Message></Error>"

    def refuse_if_match(request: Any, **_: Any) -> AWSResponse | None:
        if "If-Match" not in request.headers:
            return None  # sent to moto as ever
        refused.append(request.url)
        return AWSResponse(request.url, 501, {"Content-Type": "application/xml"}, Body())

    store.origin._s3.meta.events.register("before-send.s3.DeleteObject", refuse_if_match)
    with caplog.at_level("WARNING", logger="labswarm.store.orphans"):
        assert collect_garbage(store, {"exp": {"mfcc": []}}).orphans == 0
    assert len(refused) == 1  # the probe's, the orphan's never tried
    assert "refuses conditional deletes" in caplog.text and "NotImplemented" in caplog.text, caplog.text
    assert "127.0.0.1:9000" in caplog.text
    assert len([o for o in s3_endpoint.objects() if o.endswith(".pack")]) == 1
    assert not [o for o in s3_endpoint.objects() if orphans_module.PROBE in o]  # both scratch objects gone
