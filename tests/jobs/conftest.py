"""Fixtures of the jobs tests: a real S3 API server with a fresh bucket per test.

``.ci/s3`` starts moto's S3 server on http://127.0.0.1:9000 (``LABSWARM_TEST_S3`` names another S3-compatible
server). Without a server the S3 tests skip locally and fail in CI (``CI=true``).

(``tests/jobs`` is a package so that its modules' basenames, e.g. ``test_local``, cannot clash with the top-level
tests'.)
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

#: Where ``.ci/s3`` starts the S3 API server.
S3_URL = "http://127.0.0.1:9000"
#: Credentials for the test server (moto takes any); a real server takes them from the environment.
TEST_KEY, TEST_SECRET = "labswarm-test-key", "labswarm-test-secret-do-not-print"


def _missing_service(message: str) -> None:
    """Skip the test locally; fail it in CI (``CI=true``), where the service must be there."""
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def s3_url() -> str:
    """The S3 API server's URL, once it answered; skips when it does not, but fails when ``CI`` is ``"true"``."""
    url = os.environ.get("LABSWARM_TEST_S3", S3_URL).rstrip("/")
    try:
        urllib.request.urlopen(url + "/", timeout=30).close()  # refused at once if absent; a loaded server may be slow
    except urllib.error.HTTPError:
        pass  # it answers (a real server refuses an anonymous listing)
    except OSError as exc:
        _missing_service(f"no S3 API server answers at {url} ({exc}); run `bash .ci/s3`")
    return url


@dataclass
class S3Endpoint:
    """A bucket of its own on the test server.

    Attributes:
        url: the server's URL.
        bucket: the test's bucket (created empty, deleted after the test).
        client: a boto3 client of the server, for checks behind the storage's back.
    """

    url: str
    bucket: str
    client: Any

    def spec(self, **params: Any) -> dict[str, Any]:
        """An ``s3`` storage spec of the bucket, with ``params`` (``prefix``, ...) on top."""
        return {"name": "s3", "endpoint": self.url, "bucket": self.bucket, **params}

    def objects(self) -> list[str]:
        """Every object key in the bucket, sorted."""
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket)
        return sorted(item["Key"] for page in pages for item in page.get("Contents", ()))


@pytest.fixture
def s3_endpoint(s3_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Endpoint]:
    """A unique, empty bucket on the S3 API server; the AWS credential variables are set for the test server
    (kept as they are for a server named by ``LABSWARM_TEST_S3``)."""
    try:
        import boto3
    except ImportError:
        _missing_service("boto3 is not installed: pip install -e '.[s3]'")
    if "LABSWARM_TEST_S3" not in os.environ or not os.environ.get("AWS_ACCESS_KEY_ID"):
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", TEST_KEY)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", TEST_SECRET)
        monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    client = boto3.client("s3", endpoint_url=s3_url, region_name="us-east-1",
                          aws_access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"],
                          aws_session_token=os.environ.get("AWS_SESSION_TOKEN"))
    endpoint = S3Endpoint(s3_url, f"labswarm-test-{uuid.uuid4().hex[:12]}", client)
    client.create_bucket(Bucket=endpoint.bucket)
    try:
        yield endpoint
    finally:
        for key in endpoint.objects():
            client.delete_object(Bucket=endpoint.bucket, Key=key)
        client.delete_bucket(Bucket=endpoint.bucket)
        client.close()
