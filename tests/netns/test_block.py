"""Cluster.block: one host drops its traffic with one address, or with one TCP port there, and unblock undoes it."""

from __future__ import annotations

import os
import sys

import pytest
from helpers import missing

from labswarm.netns import Cluster

pytestmark = pytest.mark.cluster

if os.geteuid() != 0:
    missing("network namespaces need root")

#: ``python -c``: exit 0 when a TCP connection to (host, port) is refused or accepted, 1 when it times out.
_KNOCK = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=0.5).close()
except ConnectionRefusedError:
    pass
except OSError:
    sys.exit(1)
"""


def knocks(cluster: Cluster, src: str, dst: str, port: int) -> bool:
    """Host ``src`` gets an answer from ``dst``'s TCP ``port`` within 0.5 s."""
    return cluster.check(src, [sys.executable, "-c", _KNOCK, cluster.address(dst), str(port)]).returncode == 0


def test_block_one_port_then_the_whole_address_and_unblock() -> None:
    with Cluster(3) as cluster:
        b = cluster.address("b")
        cluster.block("a", b, port=9)
        assert not knocks(cluster, "a", "b", 9) and knocks(cluster, "a", "b", 10)  # that port only
        assert knocks(cluster, "c", "b", 9)  # only a's traffic
        cluster.unblock("a", b, port=9)
        assert knocks(cluster, "a", "b", 9) and cluster.rules("a") == []
        cluster.block("a", b)
        assert not knocks(cluster, "a", "b", 10) and knocks(cluster, "a", "c", 10)
        cluster.unblock("a", b)
        assert knocks(cluster, "a", "b", 10) and cluster.rules("a") == []
