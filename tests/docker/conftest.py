"""Contract tests against a real Docker engine (marker ``docker``): the image's roles and a one-node swarm.

The engine, the swarm and the image come from ``bash .ci/docker`` (``.ci/setup`` runs it when ``LABSWARM_DOCKER=1``
or ``CI=true``). The image is built once per run by that setup step; the ``image`` fixture runs the script's
``image`` phase again once per test process, a layer-cache hit when the working tree is the one the setup built
(it also makes a local run test the working tree's code). Without an engine the tests skip; with ``CI=true`` they
fail (``helpers.missing``).

The network rule of this workplace holds: every container runs on the host network and is reached on 127.0.0.1 only;
no port is published, no bridge or overlay address is used.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine import IMAGE, Containers
from helpers import missing

ROOT = Path(__file__).resolve().parents[2]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.docker)


@pytest.fixture(scope="session")
def engine() -> None:
    """A Docker engine answers (``bash .ci/docker`` starts one)."""
    if shutil.which("docker") is None:
        missing("no docker client: bash .ci/docker")
    if subprocess.run(["docker", "info"], capture_output=True, timeout=120).returncode != 0:
        missing("no Docker engine answers: bash .ci/docker (or LABSWARM_DOCKER=1 bash .ci/setup)")


@pytest.fixture(scope="session")
def image(engine: None) -> str:
    """:data:`IMAGE`, built from the working tree by ``.ci/docker image`` (a cache hit when the setup built it;
    xdist's workers take turns through a lock file)."""
    with open("/tmp/labswarm-docker-image.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = subprocess.run(["bash", str(ROOT / ".ci" / "docker"), "image"], capture_output=True, text=True,
                              timeout=1200, env={**os.environ, "IMAGE": IMAGE})
    if done.returncode != 0:
        pytest.fail(f".ci/docker image failed:\n{done.stdout}{done.stderr}")
    return IMAGE


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder the containers mount at the same path (datasets, stores): readable by the image's user (uid 1000),
    which pytest's ``tmp_path`` (under a 0700 folder of root's) is not."""
    path = Path(tempfile.mkdtemp(prefix="labswarm-docker-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def containers(image: str) -> Iterator[Containers]:
    made = Containers(image)
    try:
        yield made
    finally:
        made.remove()
