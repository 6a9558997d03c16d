"""Storage plugins of training jobs: where a job reads its data and writes its checkpoints, model, logs and
metrics. ``local`` (a folder, NFS) and ``s3`` (any S3-compatible object store); a new one is a new module that
subclasses :class:`Storage` and registers itself with :func:`register_storage`."""

from labswarm.storage.base import (
    STORAGES,
    MissingObject,
    Storage,
    StorageConfig,
    register_storage,
)
from labswarm.storage.keys import MAX_KEY_BYTES, check_key
from labswarm.storage.local import LocalStorage, LocalStorageConfig
from labswarm.storage.s3 import S3_HINT, S3Storage, S3StorageConfig

__all__ = [
    "MAX_KEY_BYTES", "S3_HINT", "STORAGES", "LocalStorage", "LocalStorageConfig", "MissingObject", "S3Storage",
    "S3StorageConfig", "Storage", "StorageConfig", "check_key", "register_storage",
]
