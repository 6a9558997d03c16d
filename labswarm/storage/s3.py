"""``s3``: any S3-compatible object store (AWS S3, MinIO, Ceph RGW, moto's server, ...).

The client is **boto3** (``pip install 'labswarm[s3]'``), imported at the first operation. Why boto3 rather than
obstore or fsspec/s3fs: it is the reference S3 client, kept by AWS and used by most other tools; moto, the S3 API
server our contract tests run against, is written to test it; it has the fewest surprises with S3-compatible
servers (path-style addressing, and the newer default checksums turned off here: many such servers reject
them); and it needs no event loop (s3fs is async underneath). obstore (Rust's ``object_store``) was measured as
the feature store's write path (2026-11-26, 2-core machine, moto on loopback, a 220 kB and a 34 kB array a
sample): 0.45 ms of client CPU a PUT against boto3's 1.9, and 2.7-3.0 ms of the server's against 3.4-3.6. It is
not used because its runtime (tokio's threads) does not survive ``fork``: a child forked from a process that had
made a request hangs at its own first request, with a new store object as well (obstore 0.12.1; its maintainers
call it not fork-safe), and labswarm forks worker processes from a parent that has used the store (the local
runner's pool; Celery's prefork pool). Per request here: no parameter validation (labswarm
builds the parameters) and no ``Expect: 100-continue`` for a body under :data:`EXPECT_BYTES`.

Credentials never go in a manifest: they come from ``credentials_file`` when the manifest names one (an INI file
like ``~/.aws/credentials``: ``aws_access_key_id``, ``aws_secret_access_key``, optional ``aws_session_token``
under ``[profile]``), else from the standard environment variables ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY`` and optional ``AWS_SESSION_TOKEN``. They are read when the first request is made and
never stored in the config, so dumps and messages cannot show them.
"""

from __future__ import annotations

import configparser
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from labswarm.errors import StorageError, StorageRefused
from labswarm.storage.base import Storage, StorageConfig, register_storage
from labswarm.storage.stamps import Stamp

log = logging.getLogger(__name__)

#: How to install what the ``s3`` storage needs.
S3_HINT = "the s3 storage needs boto3: pip install 'labswarm[s3]'"

#: Keys that would carry a secret; refused in a manifest with a pointer to where credentials go.
CREDENTIAL_KEYS = frozenset({
    "aws_access_key_id", "aws_secret_access_key", "aws_session_token", "access_key", "access_key_id",
    "secret_key", "secret_access_key", "session_token", "secret", "password", "token", "credentials",
})

#: Error codes S3 answers for a missing object (``404`` and ``NotFound``: HEAD requests have no body).
_MISSING = frozenset({"NoSuchKey", "404", "NotFound"})
#: Error codes that trying again does not change (a bucket that is not there, credentials or access refused):
#: raised as StorageRefused, not retried by a feature store's uploads (labswarm.store.uploads).
_REFUSED = frozenset({"NoSuchBucket", "InvalidBucketName", "AllAccessDisabled", "403", "AccessDenied",
                      "InvalidAccessKeyId", "SignatureDoesNotMatch"})

#: The most keys one DeleteObjects request takes (S3's limit).
_DELETE_BATCH = 1000
#: Connections a client keeps open (botocore's default: 10), for :data:`labswarm.store.store.FETCH_THREADS`'s requests
#: at once and more.
POOL_CONNECTIONS = 32
#: Smallest body a PUT announces with ``Expect: 100-continue`` (botocore sends it with every PutObject and UploadPart
#: body): the service may then refuse a large body before it travels, but each request waits for a ``100 Continue``
#: answer the client reads a byte at a time. A feature array (~220 kB) goes without; a pack (32 MiB) or a part of a
#: multipart upload (8 MiB) with it.
EXPECT_BYTES = 2**20


class S3StorageConfig(StorageConfig):
    """Parameters of the ``s3`` storage.

    Attributes:
        endpoint: the service's URL (``http://127.0.0.1:9000``); ``None``: AWS S3 itself. With an endpoint,
            requests use path-style addressing (``endpoint/bucket/key``), which every S3-compatible server takes.
        bucket: the bucket; it must exist (the storage never creates one).
        prefix: every key is stored under this folder of the bucket.
        region: the region requests are signed for; default ``us-east-1``, AWS's default region, which
            S3-compatible servers accept.
        credentials_file: an INI file of credentials (see the module docstring); ``None``: the environment.
            Read on the host that runs the learner.
        profile: the section of ``credentials_file`` to read (default ``default``, as the AWS tools).
    """

    name: Literal["s3"] = "s3"
    endpoint: str | None = None
    bucket: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
    region: str = Field("us-east-1", pattern=r"^[a-z0-9-]{1,32}$")
    credentials_file: Path | None = None
    profile: str = Field("default", min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _no_credentials(cls, data: Any) -> Any:
        if isinstance(data, dict):
            found = sorted(k for k in data if isinstance(k, str) and k.lower() in CREDENTIAL_KEYS)
            if found:
                # input=None: the secret must not ride along in the error, whatever prints it
                raise ValidationError.from_exception_data("s3", [InitErrorDetails(
                    type=PydanticCustomError("credentials", "credentials never go in a manifest: set "
                                             "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or name a "
                                             "`credentials_file`"),
                    loc=(key,), input=None) for key in found])
        return data

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)  # the value is never echoed: it could hold a user:secret@ part
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL with a host")
        if parts.username is not None or parts.password is not None:
            raise ValueError("must not carry credentials (user:password@); see `credentials_file`")
        return value.rstrip("/")


#: One boto3 session for every storage of the process (made at the first request): a session parses the service
#: models once (~0.3 s), so storages and their clients come cheap. Creating clients from it is serialized by
#: :data:`_SESSION_LOCK` (a session is not thread-safe); the clients themselves are.
_SESSION: Any = None
_SESSION_LOCK = threading.Lock()


class _Connection:
    """The boto3 client, made at the first request and shared by every view (:meth:`Storage.at`)."""

    def __init__(self, config: S3StorageConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._client: Any = None

    def client(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = self._make()
            return self._client

    def _make(self) -> Any:
        try:
            import boto3
            from botocore import handlers
            from botocore.config import Config
        except ImportError as exc:
            raise StorageError(S3_HINT) from exc
        global _SESSION
        key, secret, token = self._credentials()
        settings = Config(
            s3={"addressing_style": "path" if self.config.endpoint else "auto"},
            retries={"max_attempts": 3, "mode": "standard"},
            connect_timeout=5, read_timeout=60,
            # botocore keeps 10 connections by default: a cold cache filled 32 requests at once (FeatureStore.fetch)
            # opened and dropped a connection per request beyond them (92 against 43 GETs/s from moto, 32 at once,
            # 2026-11-26, load ~29: docs/benchmarks/store.md)
            max_pool_connections=POOL_CONNECTIONS,
            request_checksum_calculation="when_required", response_checksum_validation="when_required",
            # the parameters are built here, never from a user's input: checking them against the API's model cost
            # ~0.1 ms of CPU a request (2026-11-26, docs/benchmarks/store.md)
            parameter_validation=False,
        )
        with _SESSION_LOCK:
            if _SESSION is None:
                _SESSION = boto3.session.Session()
            client = _SESSION.client("s3", endpoint_url=self.config.endpoint, region_name=self.config.region,
                                     aws_access_key_id=key, aws_secret_access_key=secret, aws_session_token=token,
                                     config=settings)
        client.meta.events.unregister("before-call.s3", handlers.add_expect_header)  # this client's copy only
        client.meta.events.register("before-call.s3", _expect_large_bodies)
        return client

    def _credentials(self) -> tuple[str, str, str | None]:
        path = self.config.credentials_file
        if path is None:
            key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
            if not key or not secret:
                raise StorageRefused("no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or name a "
                                     "`credentials_file` in the store's spec")
            return key, secret, os.environ.get("AWS_SESSION_TOKEN") or None
        parser = configparser.ConfigParser(interpolation=None)
        try:
            with open(path, encoding="utf-8") as handle:
                parser.read_file(handle)
        except (OSError, configparser.Error) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
            raise StorageRefused(f"cannot read the credentials file {path}: {reason}") from None
        profile = self.config.profile
        section = parser[profile] if parser.has_section(profile) else None
        if section is None or not section.get("aws_access_key_id") or not section.get("aws_secret_access_key"):
            raise StorageRefused(f"the credentials file {path} has no [{profile}] section with aws_access_key_id "
                                 "and aws_secret_access_key")
        return section["aws_access_key_id"], section["aws_secret_access_key"], section.get("aws_session_token")


def _expect_large_bodies(model: Any, params: dict[str, Any], **kwargs: Any) -> None:
    """botocore's ``add_expect_header`` for bodies of :data:`EXPECT_BYTES` or more only (``before-call.s3``)."""
    from botocore import handlers
    from botocore.utils import determine_content_length

    body = params.get("body")
    if hasattr(body, "read") and ((size := determine_content_length(body)) is None or size >= EXPECT_BYTES):
        handlers.add_expect_header(model, params, **kwargs)


@register_storage
class S3Storage(Storage):
    """A bucket of an S3-compatible store: a key is the object ``prefix/key``. S3 makes each object appear whole
    (a PUT or a completed multipart upload), so writes are atomic without temporary objects."""

    name: ClassVar[str] = "s3"
    config_model: ClassVar[type[StorageConfig]] = S3StorageConfig
    config: S3StorageConfig

    def __init__(self, config: S3StorageConfig, *, scope: str = "") -> None:
        super().__init__(config, scope=scope)
        self._conn = _Connection(config)
        self._whole_warned = False  # a 200 answered to a Range GetObject was logged (once per storage)

    @property
    def _s3(self) -> Any:
        return self._conn.client()

    def _describe(self, full: str) -> str:
        where = f" at {self.config.endpoint}" if self.config.endpoint else ""
        return f"s3://{self.config.bucket}/{full}{where}"

    def _explain(self, exc: Exception) -> str:
        response = getattr(exc, "response", None)
        if isinstance(response, dict):
            error = response.get("Error", {})
            code = str(error.get("Code", ""))
            if code == "NoSuchBucket":
                return f"no bucket {self.config.bucket!r}"
            if code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
                return f"access refused ({code}): check the credentials and the bucket's policy"
            return f"{code or type(exc).__name__}: {error.get('Message') or exc}"
        if type(exc).__name__ in ("EndpointConnectionError", "ConnectTimeoutError", "ConnectionClosedError"):
            return f"cannot reach {self.config.endpoint or 'AWS S3'} ({type(exc).__name__})"
        return super()._explain(exc)

    def _refused(self, exc: Exception) -> bool:
        return self._code(exc) in _REFUSED

    @staticmethod
    def _code(exc: Exception) -> str:
        response = getattr(exc, "response", None)
        return str(response.get("Error", {}).get("Code", "")) if isinstance(response, dict) else ""

    def _put_bytes(self, full: str, data: bytes) -> None:
        self._s3.put_object(Bucket=self.config.bucket, Key=full, Body=data)

    def _get_bytes(self, full: str) -> bytes:
        try:
            response = self._s3.get_object(Bucket=self.config.bucket, Key=full)
        except Exception as exc:
            if self._code(exc) in _MISSING:
                raise self._missing(full) from None
            raise
        with response["Body"] as body:
            return body.read()

    def _get_range(self, full: str, start: int, length: int) -> bytes:
        try:
            response = self._s3.get_object(Bucket=self.config.bucket, Key=full,
                                           Range=f"bytes={start}-{start + length - 1}")  # RFC 9110: inclusive
        except Exception as exc:
            if self._code(exc) in _MISSING:
                raise self._missing(full) from None
            if self._code(exc) == "InvalidRange":  # starts past the object's end: no byte of it
                return b""
            raise
        with response["Body"] as body:
            data = body.read()
        if response["ResponseMetadata"]["HTTPStatusCode"] != 200:
            return data  # a 206: the bytes asked for
        # a 200: the whole object, from a server or proxy that ignores Range (RFC 9110 14.2 allows), whatever
        # headers came with it
        if not self._whole_warned:
            self._whole_warned = True
            log.warning("%s answered a range request with the whole object (HTTP 200): every uncached read of part "
                        "of an object downloads all of it (a proxy that drops Range?)", self._describe(full))
        return data[start:start + length]

    def _put_file(self, full: str, path: Path) -> None:
        self._s3.upload_file(str(path), self.config.bucket, full)

    def _read_into(self, full: str, handle: IO[bytes]) -> None:
        try:
            self._s3.download_fileobj(self.config.bucket, full, handle)
        except Exception as exc:
            if self._code(exc) in _MISSING:
                raise self._missing(full) from None
            raise

    def _exists(self, full: str) -> bool:
        try:
            self._s3.head_object(Bucket=self.config.bucket, Key=full)
        except Exception as exc:
            if self._code(exc) in _MISSING:
                return False
            raise
        return True

    def _list(self, folder: str) -> Iterator[str]:
        pages = self._s3.get_paginator("list_objects_v2").paginate(
            Bucket=self.config.bucket, Prefix=f"{folder}/" if folder else "")
        for page in pages:
            for item in page.get("Contents", ()):
                yield item["Key"]

    def _sizes(self, folder: str) -> Iterator[tuple[str, int]]:
        pages = self._s3.get_paginator("list_objects_v2").paginate(
            Bucket=self.config.bucket, Prefix=f"{folder}/" if folder else "")
        for page in pages:
            for item in page.get("Contents", ()):
                yield item["Key"], int(item["Size"])

    def _modified(self, folder: str) -> Iterator[tuple[str, Stamp]]:
        pages = self._s3.get_paginator("list_objects_v2").paginate(
            Bucket=self.config.bucket, Prefix=f"{folder}/" if folder else "")
        for page in pages:
            for item in page.get("Contents", ()):
                yield item["Key"], Stamp(int(item["Size"]), item["LastModified"].timestamp(), item["ETag"])

    def _delete_if(self, full: str, version: str) -> bool:
        try:  # If-Match: S3 (general purpose buckets too) and moto answer 412 when the ETag differs
            self._s3.delete_object(Bucket=self.config.bucket, Key=full, IfMatch=version)
        except Exception as exc:
            if self._code(exc) in _MISSING | {"PreconditionFailed", "412"}:
                return False
            raise
        return True

    def _delete_many(self, fulls: list[str]) -> None:
        for start in range(0, len(fulls), _DELETE_BATCH):
            batch = [{"Key": key} for key in fulls[start:start + _DELETE_BATCH]]
            response = self._s3.delete_objects(Bucket=self.config.bucket, Delete={"Objects": batch, "Quiet": True})
            if errors := response.get("Errors"):
                first = errors[0]
                raise StorageError(f"cannot delete {self._describe(first.get('Key', ''))}: "
                                   f"{first.get('Code')}: {first.get('Message')} ({len(errors)} objects failed)")

    def _reachable(self) -> None:
        try:
            self._s3.head_bucket(Bucket=self.config.bucket)
        except Exception as exc:
            if self._code(exc) in ("404", "NoSuchBucket", "NotFound"):
                raise StorageError(f"{self._describe(self.root)}: no bucket {self.config.bucket!r}") from None
            raise
