"""The ``backend`` fixture: one contract test body runs against the ``local`` and the ``s3`` storage."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from labswarm.storage import Storage


@dataclass
class Backend:
    """A storage backend under test.

    Attributes:
        name: ``local`` or ``s3``.
        make: a storage of the backend with the given ``prefix``.
        raw_keys: every object the backend holds, full keys (prefix included) as the backend names them, sorted;
            for the local backend, every file, temporary ones included.
    """

    name: str
    make: Callable[..., Storage]
    raw_keys: Callable[[], list[str]]


def _files(root: Path) -> list[str]:
    if not root.is_dir():
        return []
    return sorted(Path(d, f).relative_to(root).as_posix() for d, _, files in os.walk(root) for f in files)


@pytest.fixture(params=["local", "s3"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """Each storage backend in turn (``s3`` needs the S3 API server, see ``s3_endpoint``)."""
    if request.param == "local":
        root = tmp_path / "storage"
        return Backend("local", lambda prefix="": Storage.from_spec({"name": "local", "path": str(root),
                                                                      "prefix": prefix}),
                       lambda: _files(root))
    s3 = request.getfixturevalue("s3_endpoint")
    return Backend("s3", lambda prefix="": Storage.from_spec(s3.spec(prefix=prefix)), s3.objects)
