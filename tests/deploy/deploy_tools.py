"""Paths and tools of the deployment checks (static: there is no Docker engine here or in CI)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"


def tool(name: str) -> str:
    """The path of a console script of the dev extra, next to this interpreter (the venv's ``bin``)."""
    path = Path(sys.executable).parent / name
    found = str(path) if path.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is missing: pip install -e '.[dev]' (bash .ci/setup installs it)")
    return found


def run(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=120, cwd=ROOT)
