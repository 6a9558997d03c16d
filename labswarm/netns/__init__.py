"""Several hosts on one machine: network namespaces on a common bridge, shaped links, cuts and partitions.

A :class:`Cluster` of K hosts, for the multi-host tests and the benchmarks (root only; Linux ``ip``, ``tc`` and
``iptables``)::

    with Cluster(["a", "b", "c"], profile="campus") as cluster:
        server = cluster.popen("a", [sys.executable, "-m", "http.server", "8000"])
        cluster.check("b", ["curl", f"http://{cluster.address('a')}:8000/"])
        cluster.cut("b")            # b's link down: b is unreachable, and reaches nobody
        cluster.restore("b")
        cluster.partition("a", "c") # a and c drop each other's packets; both still reach b
        cluster.block("a", GATEWAY, port=5672)  # a drops its traffic with the machine's RabbitMQ only
        tx, rx = cluster.counters("b")

Topology: each host is a namespace ``<name>`` with one interface ``eth0`` at ``198.18.0.<10+i>/24`` (RFC 2544's
benchmarking range, 198.18.0.0/15: never any other); its veth peer ``h<i>`` is a port of the bridge ``br0``,
which lives in a **namespace of its own** (the switch), not in the root one, because:

- nothing of the cluster is in the root namespace unless asked (``gateway=True``): no 198.18 route there, so a
  test's traffic cannot leave the machine, and the root's firewall (Docker's FORWARD rules, ``br_netfilter``
  sending bridged frames through the root's iptables: on here) never sees the cluster's frames;
- a cut is a switch port set down and shaping sits on both ends of each link: a process on a host cannot undo
  either from inside its own namespace;
- deleting the switch namespace removes the bridge and every host's veth at once; teardown cannot half-fail.

``gateway=True`` adds the machine itself as host ``gw`` at ``198.18.0.1``: a veth from the root namespace to the
switch, so the hosts reach services that run outside the cluster (RabbitMQ, PostgreSQL, the S3 server) at
``198.18.0.1`` when those listen on every address (RabbitMQ's ``*:5672`` here). It is not shaped.

Link profiles (:data:`PROFILES`): ``loopback`` (unshaped), ``lan`` 1 Gbit/s, ``campus`` 100 Mbit/s, ``wan``
20 Mbit/s, each a ``tbf`` qdisc at both ends of the host's link (its uplink and its downlink). This kernel has no
``netem``: no added latency or loss, only bandwidth.

Cleanup: :meth:`Cluster.close` (the context manager's exit) kills every process in the cluster's namespaces and
deletes them; an ``atexit`` hook and a SIGTERM/SIGHUP handler close every live cluster of the process; a
SIGKILLed process leaves its namespaces behind, named ``lsw-<pid>-<n>-<host>``: :func:`sweep` (run by every
new cluster) deletes those whose pid is dead, so concurrent test processes never delete each other's.
"""

from labswarm.netns.cluster import GATEWAY, NETWORK, PROFILES, TBF_LATENCY, Cluster, Host
from labswarm.netns.system import PREFIX, ClusterError, namespaces, root_links, sweep

__all__ = ["GATEWAY", "NETWORK", "PREFIX", "PROFILES", "TBF_LATENCY", "Cluster", "ClusterError", "Host",
           "namespaces", "root_links", "sweep"]
