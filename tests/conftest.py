"""Shared fixtures; the helpers they use live in ``tests/helpers.py``."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import write_dataset


@pytest.fixture
def tone_dataset(tmp_path: Path) -> Path:
    return write_dataset(tmp_path / "data")
