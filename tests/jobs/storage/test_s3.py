"""The ``s3`` storage against a real S3 API server: credentials, reachability, multipart uploads, batched
deletes, and configs that refuse credentials."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import labswarm.storage.s3 as s3_module
from labswarm.errors import ConfigError, StorageError
from labswarm.storage import S3_HINT, S3Storage, Storage

from ..conftest import TEST_SECRET, S3Endpoint


def make(spec: dict) -> S3Storage:
    storage = Storage.from_spec(spec)
    assert isinstance(storage, S3Storage)
    return storage


def test_credentials_from_a_file_win_over_the_environment(s3_endpoint: S3Endpoint, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    creds = tmp_path / "credentials"
    creds.write_text(f"[default]\naws_access_key_id = other\naws_secret_access_key = other\n\n"
                     f"[lab]\naws_access_key_id = lab-key\naws_secret_access_key = {TEST_SECRET}\n")
    storage = make(s3_endpoint.spec(credentials_file=str(creds), profile="lab"))
    assert storage._conn._credentials() == ("lab-key", TEST_SECRET, None)  # the environment holds others
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    storage.put_bytes("a", b"1")
    assert s3_endpoint.objects() == ["a"]
    assert TEST_SECRET not in repr(storage.config.model_dump())


def test_missing_credentials_say_where_they_come_from(s3_endpoint: S3Endpoint, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    with pytest.raises(StorageError, match="AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"):
        make(s3_endpoint.spec()).put_bytes("a", b"1")
    creds = tmp_path / "credentials"
    creds.write_text(f"[default]\naws_access_key_id = k\naws_secret_access_key = {TEST_SECRET}\n")
    with pytest.raises(StorageError, match=r"no \[lab\] section") as caught:
        make(s3_endpoint.spec(credentials_file=str(creds), profile="lab")).reachable()
    assert TEST_SECRET not in str(caught.value)
    with pytest.raises(StorageError, match="cannot read the credentials file"):
        make(s3_endpoint.spec(credentials_file=str(tmp_path / "absent"))).reachable()
    assert s3_endpoint.objects() == []


def test_reachable_refuses_a_missing_bucket_without_creating_it(s3_endpoint: S3Endpoint) -> None:
    spec = {**s3_endpoint.spec(), "bucket": s3_endpoint.bucket + "-absent"}
    with pytest.raises(StorageError, match="no bucket"):
        make(spec).reachable()
    names = [b["Name"] for b in s3_endpoint.client.list_buckets()["Buckets"]]
    assert spec["bucket"] not in names
    with pytest.raises(StorageError, match="no bucket"):
        make(spec).put_bytes("a", b"1")


def test_reachable_refuses_an_endpoint_that_does_not_answer(s3_endpoint: S3Endpoint) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(StorageError, match="cannot reach"):
        make({**s3_endpoint.spec(), "endpoint": f"http://127.0.0.1:{port}"}).reachable()


def test_large_files_go_up_in_parts(s3_endpoint: S3Endpoint, tmp_path: Path) -> None:
    source = tmp_path / "model.pt"
    payload = bytes(range(251)) * (9 * 1024 * 1024 // 251)  # 9 MiB: above boto3's 8 MiB multipart threshold
    source.write_bytes(payload)
    storage = make(s3_endpoint.spec(prefix="big"))
    storage.put_file("model.pt", source)
    head = s3_endpoint.client.head_object(Bucket=s3_endpoint.bucket, Key="big/model.pt")
    assert "-" in head["ETag"]  # a multipart upload's ETag ends with "-<parts>"
    assert storage.get_file("model.pt", tmp_path / "back.pt").read_bytes() == payload


def test_only_large_bodies_wait_for_100_continue(s3_endpoint: S3Endpoint) -> None:
    storage = make(s3_endpoint.spec(prefix="e"))
    sent: list[tuple[str, bool]] = []

    def record(request: Any, **_: Any) -> None:  # each request as it leaves
        expect = request.headers.get("Expect")
        sent.append((request.url.rsplit("/", 1)[-1], expect in (b"100-continue", "100-continue")))

    storage._s3.meta.events.register("before-send.s3", record)
    array, pack = b"a" * 220_800, b"p" * s3_module.EXPECT_BYTES  # a feature array; a pack's size and above
    storage.put_bytes("array", array)
    storage.put_bytes("pack", pack)
    assert sent == [("array", False), ("pack", True)]
    assert storage.get_bytes("array") == array and storage.get_bytes("pack") == pack


def test_deletes_go_in_batches(s3_endpoint: S3Endpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(s3_module, "_DELETE_BATCH", 2)
    storage = make(s3_endpoint.spec(prefix="p"))
    for i in range(5):
        storage.put_bytes(f"logs/{i}", b"x")
    storage.put_bytes("keep", b"x")
    assert storage.delete("logs") == 5
    assert s3_endpoint.objects() == ["p/keep"]


def test_without_boto3_the_error_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    storage = make({"name": "s3", "endpoint": "http://127.0.0.1:1", "bucket": "b1x"})  # no request is made
    with pytest.raises(StorageError) as caught:
        storage.reachable()
    assert S3_HINT in str(caught.value)
    assert "pip install 'labswarm[s3]'" in S3_HINT


@pytest.mark.parametrize("key", ["aws_secret_access_key", "aws_access_key_id", "secret_key", "password"])
def test_a_spec_refuses_credentials_without_echoing_them(key: str) -> None:
    secret = "AKIA-sEcReT-0123456789"
    with pytest.raises(ConfigError) as caught:
        Storage.from_spec({"name": "s3", "bucket": "results", key: secret})
    assert [path for path, _ in caught.value.errors] == [key]
    assert "credentials never go in a manifest" in str(caught.value)
    assert secret not in str(caught.value)


@pytest.mark.parametrize(("endpoint", "reason"), [
    ("http://AKIA:sEcReT@127.0.0.1:9000", "must not carry credentials"),
    ("ftp://127.0.0.1", "http:// or https://"),
    ("127.0.0.1:9000", "http:// or https://"),
])
def test_endpoint_must_be_a_plain_url(endpoint: str, reason: str) -> None:
    with pytest.raises(ConfigError, match=reason) as caught:
        Storage.from_spec({"name": "s3", "bucket": "results", "endpoint": endpoint})
    assert [path for path, _ in caught.value.errors] == ["endpoint"]
    assert "sEcReT" not in str(caught.value)


def test_describe_names_bucket_and_key_but_no_credential(s3_endpoint: S3Endpoint) -> None:
    storage = make(s3_endpoint.spec(prefix="p")).at("jobs/j1")
    assert storage.describe("model.pt") == f"s3://{s3_endpoint.bucket}/p/jobs/j1/model.pt at {s3_endpoint.url}"
    with pytest.raises(StorageError) as caught:
        storage.get_bytes("model.pt")
    assert TEST_SECRET not in str(caught.value)
    assert storage.describe("model.pt") in str(caught.value)


def test_importing_the_storages_does_not_import_boto3() -> None:
    code = ("import sys, labswarm.jobs, labswarm.storage; "
            "from labswarm.storage import Storage; "
            "Storage.from_spec({'name': 's3', 'bucket': 'results'}); "
            "print('boto3' in sys.modules, 'botocore' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_a_range_answered_with_the_whole_object_is_cut(s3_endpoint: S3Endpoint,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """A server or proxy that ignores Range answers 200 with the whole object (RFC 9110 allows it): get_range gives
    the bytes asked for all the same, told by the status (a stray Content-Range header on the 200 changes nothing),
    and the storage logs it once (review #9, rev2 #9; here the client's Range header is dropped before it is
    sent)."""
    storage = make(s3_endpoint.spec())
    storage.put_bytes("pack", bytes(range(100)))
    assert storage.get_range("pack", 10, 5) == bytes(range(10, 15))  # a 206, as moto answers a Range
    statuses: list[int] = []

    def drop_range(request: Any, **_: Any) -> None:
        del request.headers["Range"]

    def stray_content_range(response_dict: dict, **_: Any) -> None:  # a proxy passing a Content-Range on
        if response_dict["status_code"] == 200:
            response_dict["headers"]["content-range"] = "bytes 0-99/100"

    storage._s3.meta.events.register("before-sign.s3.GetObject", drop_range)
    storage._s3.meta.events.register("before-parse.s3.GetObject", stray_content_range)
    storage._s3.meta.events.register(
        "after-call.s3.GetObject", lambda http_response, **_: statuses.append(http_response.status_code))
    with caplog.at_level(logging.WARNING, logger="labswarm.storage.s3"):
        assert storage.get_range("pack", 10, 5) == bytes(range(10, 15))
        assert storage.get_range("pack", 95, 10) == bytes(range(95, 100))
    assert statuses == [200, 200]
    warned = [m for r in caplog.records if "answered a range request with the whole object" in (m := r.getMessage())]
    assert len(warned) == 1 and storage.describe("pack") in warned[0], caplog.text  # once per storage
