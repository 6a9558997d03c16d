"""Fixtures of the training tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from three_classes import write_three_classes


@pytest.fixture
def three_classes(tmp_path: Path) -> Path:
    return write_three_classes(tmp_path / "data")
