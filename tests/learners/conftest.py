"""Fixtures of the distributed-learner tests: the job's rendezvous store, hosted here as the coordinator."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from helpers import require

torch = require("torch")  # skips here, fails in CI (tests/helpers.py)


@pytest.fixture
def store() -> Iterator[Any]:
    """A ``TCPStore`` server on a free loopback port (the coordinator's, as the lifecycle manager will host)."""
    from torch.distributed import TCPStore

    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    yield server
    del server


@pytest.fixture
def master_env(store: Any) -> dict[str, str]:
    """The rendezvous part of a learner's environment, pointing at :func:`store`."""
    return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port), "LABSWARM_COLLECTIVE_TIMEOUT_S": "20"}
