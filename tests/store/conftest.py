"""Fixtures of the feature-store tests: a store on each backend (``local`` folder, ``s3`` on the test S3 server of
``tests/jobs/conftest.py``, moto's server on :9000, a fresh bucket per test)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from jobs.conftest import S3Endpoint, s3_endpoint, s3_url  # noqa: F401 - fixtures used by the tests here

from labswarm.store import FeatureStore
from labswarm.store.written import ENV


@pytest.fixture(autouse=True)
def _per_key_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """A remote store opened here without ``packed`` writes an object per key (the layout these tests were
    written for: read-side packs made of per-key objects, a GET per array); the written packs' tests and the
    contract's ``-packs`` stores ask for packs."""
    monkeypatch.setenv(ENV, "0")


@pytest.fixture(params=["local", "s3", "s3-cached", "s3-packs", "s3-packs-cached"])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], FeatureStore]:
    """A factory of the test's store on the ``local`` backend, then on ``s3`` uncached (every read a request),
    then on ``s3`` behind a local cache (reads memory-map the cached file); each ``s3`` one in both write layouts:
    an object per key, and written packs (``-packs``: :mod:`labswarm.store.written`)."""
    if request.param == "local":
        return lambda: FeatureStore(tmp_path / "store")
    endpoint: S3Endpoint = request.getfixturevalue("s3_endpoint")
    spec = endpoint.spec(prefix="features")
    cache_bytes = 0 if request.param in ("s3", "s3-packs") else 1 << 30
    packed = "packs" in request.param
    return lambda: FeatureStore.open(tmp_path / "cache", remote=spec, cache_bytes=cache_bytes, packed=packed)
