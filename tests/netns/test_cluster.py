"""The cluster harness (labswarm.netns): hosts in network namespaces on one bridge, shaped links, a cut and its
restore, a partition, the byte counters, and nothing left behind. Root only (CI runs as root)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from helpers import missing

from labswarm import netns
from labswarm.netns import Cluster, ClusterError

pytestmark = pytest.mark.cluster

if os.geteuid() != 0:
    missing("network namespaces need root")

#: ``python -c``: exit 0 when a TCP connection to (host, port) is refused or accepted (the host answers), 1 when
#: it times out (no route, a cut link, a DROP rule).
_REACH = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], 9), timeout=float(sys.argv[2])).close()
except ConnectionRefusedError:
    pass
except OSError:
    sys.exit(1)
"""


def reaches(cluster: Cluster, src: str, dst: str, timeout: float = 0.5) -> bool:
    """Host ``src`` gets an answer (a TCP RST from port 9) from ``dst`` within ``timeout`` s."""
    return cluster.check(src, [sys.executable, "-c", _REACH, cluster.address(dst), str(timeout)]).returncode == 0


def _ours(cluster: Cluster) -> list[str]:
    return [n for n in netns.namespaces() if n.startswith(cluster.tag + "-")]


def test_hosts_reach_each_other_and_close_leaves_nothing() -> None:
    with Cluster(["a", "b", "c"], gateway=True) as cluster:
        assert len(_ours(cluster)) == 4  # three hosts and the switch
        assert [h.address for h in cluster] == ["198.18.0.10", "198.18.0.11", "198.18.0.12"]
        assert all(reaches(cluster, s, d) for s in "abc" for d in "abc" if s != d)
        ping = cluster.check("b", [sys.executable, "-c", _REACH, netns.GATEWAY, "0.5"])
        assert ping.returncode == 0  # the machine itself, through the gateway veth
        assert cluster.gateway in netns.root_links()
        proc = cluster.popen("a", ["sleep", "60"])
    assert _ours(cluster) == [] and cluster.gateway not in netns.root_links()
    assert proc.poll() is not None  # its process killed
    with pytest.raises(ClusterError, match="unknown link profile"):
        Cluster(2, profile="dialup")


def test_a_cut_link_and_its_restore() -> None:
    with Cluster(3) as cluster:
        cluster.cut("b")
        assert not reaches(cluster, "a", "b") and not reaches(cluster, "b", "c")
        assert reaches(cluster, "a", "c")  # the others go on
        cluster.restore("b")
        deadline = time.monotonic() + 5
        while not reaches(cluster, "a", "b") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert reaches(cluster, "a", "b") and reaches(cluster, "b", "c")


def test_a_partition_drops_only_the_two_hosts_traffic_and_heals() -> None:
    with Cluster(3) as cluster:
        cluster.partition("a", "b")
        assert not reaches(cluster, "a", "b") and not reaches(cluster, "b", "a")
        assert reaches(cluster, "a", "c") and reaches(cluster, "b", "c")
        assert len(cluster.rules("a")) == 2 and len(cluster.rules("b")) == 2
        cluster.heal("a", "b")
        assert reaches(cluster, "a", "b") and cluster.rules("a") == cluster.rules("b") == []
    root = subprocess.run(["iptables", "-S"], capture_output=True, text=True, check=True).stdout
    assert "198.18." not in root  # every rule lived inside the namespaces


@pytest.mark.parametrize(("profile", "nbytes"), [("campus", 15_000_000), ("wan", 3_000_000)])
def test_a_shaped_link_runs_at_its_profiles_rate_and_the_counters_see_the_bytes(profile: str, nbytes: int) -> None:
    rate = netns.PROFILES[profile]
    assert rate is not None
    with Cluster(2, profile=profile) as cluster:
        before = {h: cluster.counters(h) for h in "ab"}
        measured = cluster.throughput("b", "a", nbytes)
        after = {h: cluster.counters(h) for h in "ab"}
    assert measured * 8 == pytest.approx(rate, rel=0.15), f"{measured * 8 / 1e6:.1f} Mbit/s"
    sent = after["b"][0] - before["b"][0]
    got = after["a"][1] - before["a"][1]
    assert nbytes <= sent <= nbytes * 1.1 and nbytes <= got <= nbytes * 1.1  # payload plus TCP/IP headers
    assert sent == pytest.approx(got, rel=1e-3)  # one wire: what b sent, a received (give or take an IPv6 ND frame)


def test_sweep_removes_what_a_dead_process_left() -> None:
    # a child makes a cluster and is SIGKILLed: its namespaces stay until a sweep (any new cluster runs one)
    with subprocess.Popen([sys.executable, "-c", "from labswarm.netns import Cluster; import time\n"
                           "c = Cluster(2).start(); print(c.tag, flush=True); time.sleep(60)"],
                          stdout=subprocess.PIPE, text=True) as child:
        try:
            tag = child.stdout.readline().strip() if child.stdout else ""
            assert tag, "the child made no cluster"
        finally:
            child.kill()
    left = [n for n in netns.namespaces() if n.startswith(tag + "-")]
    assert len(left) == 3
    assert set(left) <= set(netns.sweep())
    assert [n for n in netns.namespaces() if n.startswith(tag + "-")] == []


def test_sigterm_tears_the_cluster_down() -> None:
    with subprocess.Popen([sys.executable, "-c", "from labswarm.netns import Cluster; import time\n"
                           "c = Cluster(2, gateway=True).start(); print(c.tag, c.gateway, flush=True); "
                           "time.sleep(60)"], stdout=subprocess.PIPE, text=True) as child:
        try:
            tag, gateway = (child.stdout.readline().split() if child.stdout else ["", ""])
            child.terminate()
            assert child.wait(timeout=20) == -15  # the handler closed the cluster, then died of the signal
        finally:
            child.kill()
    assert [n for n in netns.namespaces() if n.startswith(tag + "-")] == []
    assert gateway not in netns.root_links()
