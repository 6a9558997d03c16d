"""Fixtures of the multi-host reliability tests (their site: :mod:`netns_site`): a RabbitMQ user the cluster's
hosts may log in with (``guest`` is loopback-only), and sites torn down after each test."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import missing
from netns_site import MANAGEMENT, RABBITMQCTL, Site

from labswarm.netns import Cluster


@pytest.fixture(scope="session")
def broker_user() -> Iterator[tuple[str, str]]:
    """A RabbitMQ user (all permissions on ``/``) that may log in from the cluster's hosts: (user, password)."""
    if os.geteuid() != 0:
        missing("network namespaces need root")
    if not os.access(RABBITMQCTL, os.X_OK):
        missing(f"{RABBITMQCTL} is missing: the multi-host tests need the local RabbitMQ")
    try:
        httpx.get(f"{MANAGEMENT}/overview", auth=("guest", "guest"), timeout=10).raise_for_status()
    except httpx.HTTPError as exc:
        missing(f"RabbitMQ's management API is not reachable at {MANAGEMENT} ({exc}): run `bash .ci/rabbitmq`")
    user, password = f"netns-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex

    def ctl(*args: str) -> None:
        subprocess.run([RABBITMQCTL, *args], check=True, capture_output=True, timeout=120)

    ctl("add_user", user, password)
    try:
        ctl("set_permissions", "-p", "/", user, ".*", ".*", ".*")
        yield user, password
    finally:
        ctl("delete_user", user)


@pytest.fixture
def make_site(tmp_path: Path, broker_user: tuple[str, str]) -> Iterator[Callable[..., Site]]:
    """``make_site(cluster, **kwargs)``: a :class:`Site` on a started cluster, its queue deleted after the test
    (the cluster's ``with`` kills its processes)."""
    sites: list[Site] = []

    def make(cluster: Cluster, **kwargs: Any) -> Site:
        site = Site(cluster, tmp_path, broker_user, **kwargs)
        sites.append(site)
        return site

    yield make
    for site in sites:
        site.close()

