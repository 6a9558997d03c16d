"""Several hosts on one machine: network namespaces on a common bridge, shaped links, cuts and partitions.

A :class:`Cluster` of K hosts, for the multi-host tests and the benchmarks (root only; Linux ``ip``, ``tc`` and
``iptables``)::

    with Cluster(["a", "b", "c"], profile="campus") as cluster:
        server = cluster.popen("a", [sys.executable, "-m", "http.server", "8000"])
        cluster.check("b", ["curl", f"http://{cluster.address('a')}:8000/"])
        cluster.cut("b")            # b's link down: b is unreachable, and reaches nobody
        cluster.restore("b")
        cluster.partition("a", "c") # a and c drop each other's packets; both still reach b
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

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any

from labswarm.errors import LabswarmError

#: Namespace and root-interface name prefix of every cluster (:func:`sweep` looks for it).
PREFIX = "lsw"
#: Link rate by profile, in bit/s (``None``: unshaped).
PROFILES: dict[str, int | None] = {"loopback": None, "lan": 1_000_000_000, "campus": 100_000_000,
                                   "wan": 20_000_000}
#: The hosts' /24, inside 198.18.0.0/15 (RFC 2544); host ``i`` is ``.<10+i>``, the gateway ``.1``.
NETWORK = "198.18.0"
#: The gateway's address (``gateway=True``): the root namespace, i.e. the machine's own services.
GATEWAY = f"{NETWORK}.1"
#: Seconds of queue a tbf keeps before dropping (its ``latency``).
TBF_LATENCY = "50ms"

_NAMESPACE = re.compile(rf"^{PREFIX}-(\d+)-(\d+)-(\S+)$")
_ROOT_LINK = re.compile(rf"^{PREFIX}(\d+)g(\d+)$")
_live: set[Cluster] = set()
_counter = iter(range(10**6))
_hooks_lock = threading.Lock()
_hooked = False


class ClusterError(LabswarmError):
    """A cluster could not be made, changed or torn down (not root, a command failed, an unknown host or profile)."""


def _run(argv: Sequence[str], check: bool = True) -> str:
    """Run a command; its stdout. Raises ClusterError with its stderr when it fails and ``check``."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ClusterError(f"{' '.join(argv)}: {exc}") from exc
    if check and done.returncode != 0:
        raise ClusterError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_namespace(name: str) -> None:
    """Kill every process inside namespace ``name``, then delete it."""
    for _ in range(50):
        pids = [int(p) for p in _run(["ip", "netns", "pids", name], check=False).split()]
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)
    _run(["ip", "netns", "delete", name], check=False)


def namespaces() -> list[str]:
    """Every cluster namespace on the machine (any process's)."""
    names = (line.split()[0] for line in _run(["ip", "netns", "list"], check=False).splitlines() if line.strip())
    return sorted(n for n in names if _NAMESPACE.match(n))


def root_links() -> list[str]:
    """Every cluster interface in the root namespace (a gateway's veth; any process's)."""
    links = json.loads(_run(["ip", "-j", "link", "show"], check=False) or "[]")
    return sorted(link["ifname"] for link in links if _ROOT_LINK.match(link.get("ifname", "")))


def sweep(all_: bool = False) -> list[str]:
    """Delete what clusters of dead processes left (namespaces, root veths; iptables rules live and die inside the
    namespaces), or, with ``all_``, every cluster's. Returns what was deleted."""
    gone = []
    for name in namespaces():
        match = _NAMESPACE.match(name)
        if match and (all_ or not _alive(int(match.group(1)))):
            _kill_namespace(name)
            gone.append(name)
    for link in root_links():
        match = _ROOT_LINK.match(link)
        if match and (all_ or not _alive(int(match.group(1)))):
            _run(["ip", "link", "delete", link], check=False)
            gone.append(link)
    return gone


def _close_all() -> None:
    for cluster in list(_live):
        with contextlib.suppress(Exception):
            cluster.close()


def _chained(signum: int, frame: FrameType | None, *, previous: Any) -> None:
    _close_all()
    if callable(previous):
        previous(signum, frame)
    else:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _install_hooks() -> None:
    """Once per process: close live clusters at exit and on SIGTERM/SIGHUP (chained to the previous handler)."""
    global _hooked
    with _hooks_lock:
        if _hooked:
            return
        _hooked = True
        atexit.register(_close_all)
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGTERM, signal.SIGHUP):
            previous = signal.getsignal(signum)
            if previous is signal.SIG_IGN:
                continue
            signal.signal(signum, functools.partial(_chained, previous=previous))


@dataclass(frozen=True)
class Host:
    """One host of a cluster.

    Attributes:
        name: its name in the cluster (``a``, ``b``, ...).
        netns: its network namespace.
        address: its IPv4 address (198.18.0.0/15).
        port: its veth's end on the switch (``h<i>``), in the switch namespace.
    """

    name: str
    netns: str
    address: str
    port: str


class Cluster:
    """K hosts on one bridge (module docstring). Made by :meth:`start` (or ``with``), undone by :meth:`close`.

    Args:
        hosts: the hosts' names, or how many (named ``a``, ``b``, ...; at most 200).
        profile: every host's link profile (:data:`PROFILES`); :meth:`shape` changes one host's.
        gateway: also link the root namespace to the switch at :data:`GATEWAY` (unshaped).

    Raises:
        ClusterError: an unknown profile, a bad host name, not root, or a command failed.
    """

    def __init__(self, hosts: int | Sequence[str] = 2, profile: str = "loopback", gateway: bool = False) -> None:
        names = [chr(ord("a") + i) for i in range(hosts)] if isinstance(hosts, int) else list(hosts)
        if not 1 <= len(names) <= 200 or len(set(names)) != len(names):
            raise ClusterError(f"1 to 200 distinct host names, got {names}")
        if any(not re.fullmatch(r"[a-z][a-z0-9]{0,15}", n) or n in ("sw", "gw") for n in names):
            raise ClusterError(f"host names are [a-z][a-z0-9]* (not 'sw' or 'gw'), got {names}")
        _rate(profile)
        self.tag = f"{PREFIX}-{os.getpid()}-{next(_counter)}"
        self.switch = f"{self.tag}-sw"
        self.hosts = {n: Host(n, f"{self.tag}-{n}", f"{NETWORK}.{10 + i}", f"h{i}") for i, n in enumerate(names)}
        self.profiles = dict.fromkeys(names, profile)
        self.gateway = f"{PREFIX}{os.getpid()}g{self.tag.rsplit('-', 1)[1]}" if gateway else None
        self._procs: list[subprocess.Popen[Any]] = []
        self._partitions: set[tuple[str, str]] = set()
        self.started = False

    # lifecycle
    def start(self) -> Cluster:
        """Sweep what dead processes left, then make the switch and the hosts and shape their links."""
        if os.geteuid() != 0:
            raise ClusterError("network namespaces need root")
        sweep()
        _install_hooks()
        _live.add(self)
        self.started = True
        try:
            _run(["ip", "netns", "add", self.switch])
            _run(["ip", "-n", self.switch, "link", "add", "br0", "type", "bridge"])
            _run(["ip", "-n", self.switch, "link", "set", "br0", "up"])
            for host in self.hosts.values():
                self._add_host(host)
            if self.gateway is not None:
                _run(["ip", "-n", self.switch, "link", "add", "gw", "type", "veth", "peer", "name", self.gateway,
                      "netns", "1"])
                _run(["ip", "-n", self.switch, "link", "set", "gw", "master", "br0", "up"])
                _run(["ip", "addr", "add", f"{GATEWAY}/24", "dev", self.gateway])
                _run(["ip", "link", "set", self.gateway, "up"])
        except BaseException:
            self.close()
            raise
        return self

    def _add_host(self, host: Host) -> None:
        _run(["ip", "netns", "add", host.netns])
        _run(["ip", "-n", self.switch, "link", "add", host.port, "type", "veth", "peer", "name", "eth0",
              "netns", host.netns])
        _run(["ip", "-n", self.switch, "link", "set", host.port, "master", "br0", "up"])
        _run(["ip", "-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0"])
        _run(["ip", "-n", host.netns, "link", "set", "eth0", "up"])
        _run(["ip", "-n", host.netns, "link", "set", "lo", "up"])
        self.shape(host.name, self.profiles[host.name])

    def close(self) -> None:
        """Kill the cluster's processes and delete its namespaces and gateway veth (idempotent; never raises for
        what is already gone)."""
        for proc in self._procs:
            with contextlib.suppress(OSError):
                proc.kill()
        for proc in self._procs:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        self._procs.clear()
        for host in self.hosts.values():
            _kill_namespace(host.netns)
        _kill_namespace(self.switch)  # the bridge, the switch-side veths and the gateway's peer with it
        if self.gateway is not None:
            _run(["ip", "link", "delete", self.gateway], check=False)
        _live.discard(self)
        self.started = False

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # hosts and processes
    def host(self, name: str) -> Host:
        """The host ``name``. Raises ClusterError for an unknown one."""
        try:
            return self.hosts[name]
        except KeyError:
            raise ClusterError(f"no host {name!r} in this cluster (hosts: {', '.join(self.hosts)})") from None

    def address(self, name: str) -> str:
        """Host ``name``'s IPv4 address."""
        return self.host(name).address

    def command(self, name: str, argv: Sequence[str]) -> list[str]:
        """``argv`` as run on host ``name`` (``ip netns exec``)."""
        return ["ip", "netns", "exec", self.host(name).netns, *argv]

    def popen(self, name: str, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` on host ``name`` (``subprocess.Popen`` keywords pass through); :meth:`close` kills it."""
        proc = subprocess.Popen(self.command(name, argv), **kwargs)
        self._procs.append(proc)
        return proc

    def check(self, name: str, argv: Sequence[str], timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on host ``name`` to its end (text output captured, not checked)."""
        return subprocess.run(self.command(name, argv), capture_output=True, text=True, timeout=timeout,
                              check=False)

    # the network
    def shape(self, name: str, profile: str) -> None:
        """Host ``name``'s link at ``profile``'s rate both ways (a tbf at each end), or unshaped (``loopback``)."""
        rate, host = _rate(profile), self.host(name)
        for netns, dev in ((host.netns, "eth0"), (self.switch, host.port)):
            _run(["tc", "-n", netns, "qdisc", "del", "dev", dev, "root"], check=False)
            if rate is not None:
                burst = max(rate // 8 // 100, 256 * 1024)  # 10 ms at the rate, at least 4 GSO packets
                _run(["tc", "-n", netns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{rate}bit",
                      "burst", str(burst), "latency", TBF_LATENCY])
        self.profiles[name] = profile

    def cut(self, name: str) -> None:
        """Host ``name``'s link down at the switch: it reaches nobody and nobody reaches it."""
        _run(["ip", "-n", self.switch, "link", "set", self.host(name).port, "down"])

    def restore(self, name: str) -> None:
        """Host ``name``'s link up again (its addresses and shaping stay)."""
        _run(["ip", "-n", self.switch, "link", "set", self.host(name).port, "up"])

    def partition(self, a: str, b: str) -> None:
        """Hosts ``a`` and ``b`` drop each other's packets (iptables DROP both ways inside each); the others still
        reach both."""
        for me, peer in ((a, b), (b, a)):
            for rule in (["OUTPUT", "-d"], ["INPUT", "-s"]):
                self._iptables(me, ["-A", rule[0], rule[1], self.address(peer), "-j", "DROP"])
        self._partitions.add((a, b))

    def heal(self, a: str, b: str) -> None:
        """Undo :meth:`partition` of ``a`` and ``b``."""
        for me, peer in ((a, b), (b, a)):
            for rule in (["OUTPUT", "-d"], ["INPUT", "-s"]):
                self._iptables(me, ["-D", rule[0], rule[1], self.address(peer), "-j", "DROP"], check=False)
        self._partitions.discard((a, b))

    def _iptables(self, name: str, args: list[str], check: bool = True) -> None:
        _run(self.command(name, ["iptables", "-w", *args]), check=check)

    def rules(self, name: str) -> list[str]:
        """Host ``name``'s iptables rules (``iptables -S``, the policies left out)."""
        out = _run(self.command(name, ["iptables", "-w", "-S"]))
        return [line for line in out.splitlines() if not line.startswith("-P ")]

    def counters(self, name: str) -> tuple[int, int]:
        """Host ``name``'s bytes on the wire since it was made: ``(tx, rx)`` of its ``eth0`` (Ethernet frames)."""
        [link] = json.loads(_run(["ip", "-j", "-s", "-n", self.host(name).netns, "link", "show", "eth0"]))
        stats = link["stats64"]
        return int(stats["tx"]["bytes"]), int(stats["rx"]["bytes"])

    def throughput(self, src: str, dst: str, nbytes: int = 4_000_000, port: int = 5201) -> float:
        """Send ``nbytes`` over TCP from host ``src`` to host ``dst``; the receiver's rate in bytes/s, first byte
        to last (a Python sender and receiver: ~1 GB/s of headroom here, above every profile)."""
        receiver = self.popen(dst, [sys.executable, "-c", _RECEIVER, self.address(dst), str(port), str(nbytes)],
                              stdout=subprocess.PIPE, text=True)
        try:
            sent = self.check(src, [sys.executable, "-c", _SENDER, self.address(dst), str(port), str(nbytes)],
                              timeout=120)
            if sent.returncode != 0:
                raise ClusterError(f"{src} -> {dst}: the sender failed: {sent.stderr.strip()}")
            out, _ = receiver.communicate(timeout=120)
        finally:
            with contextlib.suppress(OSError):
                receiver.kill()
        return float(out.strip())

    def __iter__(self) -> Iterator[Host]:
        return iter(self.hosts.values())


def _rate(profile: str) -> int | None:
    try:
        return PROFILES[profile]
    except KeyError:
        raise ClusterError(f"unknown link profile {profile!r} (known: {', '.join(PROFILES)})") from None


#: ``python -c`` receiver: accept one connection, read N bytes, print the rate (bytes/s, first byte to last).
_RECEIVER = """
import socket, sys, time
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.create_server((host, port)); c, _ = s.accept(); got, first, head = 0, None, 0
buf = bytearray(1 << 20)
while got < n:
    k = c.recv_into(buf)
    if not k: break
    if first is None: first, head = time.perf_counter(), k
    got += k
print((got - head) / max(time.perf_counter() - first, 1e-9))
"""
#: ``python -c`` sender: connect (retrying while the receiver starts) and send N bytes.
_SENDER = """
import socket, sys, time
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for _ in range(200):
    try: c = socket.create_connection((host, port), timeout=30); break
    except OSError: time.sleep(0.02)
data = bytes(1 << 20); left = n
while left > 0: left -= c.send(data[:left])
c.shutdown(socket.SHUT_WR); c.recv(1); c.close()
"""
