"""A :class:`Cluster` of hosts in network namespaces (see :mod:`labswarm.netns`)."""

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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any

from labswarm.netns.system import PREFIX, ClusterError, kill_namespace, run, sweep

#: Link rate by profile, in bit/s (``None``: unshaped).
PROFILES: dict[str, int | None] = {"loopback": None, "lan": 1_000_000_000, "campus": 100_000_000,
                                   "wan": 20_000_000}
#: The hosts' /24, inside 198.18.0.0/15 (RFC 2544); host ``i`` is ``.<10+i>``, the gateway ``.1``.
NETWORK = "198.18.0"
#: The gateway's address (``gateway=True``): the root namespace, i.e. the machine's own services.
GATEWAY = f"{NETWORK}.1"
#: Seconds of queue a tbf keeps before dropping (its ``latency``).
TBF_LATENCY = "50ms"

_live: set[Cluster] = set()
_counter = iter(range(10**6))
_hooks_lock = threading.Lock()
_hooked = False


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
            run(["ip", "netns", "add", self.switch])
            run(["ip", "-n", self.switch, "link", "add", "br0", "type", "bridge"])
            run(["ip", "-n", self.switch, "link", "set", "br0", "up"])
            for host in self.hosts.values():
                self._add_host(host)
            if self.gateway is not None:
                run(["ip", "-n", self.switch, "link", "add", "gw", "type", "veth", "peer", "name", self.gateway,
                      "netns", "1"])
                run(["ip", "-n", self.switch, "link", "set", "gw", "master", "br0", "up"])
                run(["ip", "addr", "add", f"{GATEWAY}/24", "dev", self.gateway])
                run(["ip", "link", "set", self.gateway, "up"])
        except BaseException:
            self.close()
            raise
        return self

    def _add_host(self, host: Host) -> None:
        run(["ip", "netns", "add", host.netns])
        run(["ip", "-n", self.switch, "link", "add", host.port, "type", "veth", "peer", "name", "eth0",
              "netns", host.netns])
        run(["ip", "-n", self.switch, "link", "set", host.port, "master", "br0", "up"])
        run(["ip", "-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0"])
        run(["ip", "-n", host.netns, "link", "set", "eth0", "up"])
        run(["ip", "-n", host.netns, "link", "set", "lo", "up"])
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
            kill_namespace(host.netns)
        kill_namespace(self.switch)  # the bridge, the switch-side veths and the gateway's peer with it
        if self.gateway is not None:
            run(["ip", "link", "delete", self.gateway], check=False)
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
            run(["tc", "-n", netns, "qdisc", "del", "dev", dev, "root"], check=False)
            if rate is not None:
                burst = max(rate // 8 // 100, 256 * 1024)  # 10 ms at the rate, at least 4 GSO packets
                run(["tc", "-n", netns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{rate}bit",
                      "burst", str(burst), "latency", TBF_LATENCY])
        self.profiles[name] = profile

    def cut(self, name: str) -> None:
        """Host ``name``'s link down at the switch: it reaches nobody and nobody reaches it."""
        run(["ip", "-n", self.switch, "link", "set", self.host(name).port, "down"])

    def restore(self, name: str) -> None:
        """Host ``name``'s link up again (its addresses and shaping stay)."""
        run(["ip", "-n", self.switch, "link", "set", self.host(name).port, "up"])

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

    def block(self, name: str, address: str, port: int | None = None) -> None:
        """Host ``name`` drops its traffic with ``address`` (any host's, or :data:`GATEWAY`: the machine's
        services), only TCP port ``port`` at that address when given (e.g. 5672: the host is partitioned from
        RabbitMQ on the gateway while the rest of the machine still reaches it). iptables DROP inside ``name``'s
        namespace, so gone with it; :meth:`unblock` undoes it."""
        for args in _block_rules(address, port):
            self._iptables(name, ["-A", *args])

    def unblock(self, name: str, address: str, port: int | None = None) -> None:
        """Undo :meth:`block` of ``address`` (and ``port``) on host ``name``."""
        for args in _block_rules(address, port):
            self._iptables(name, ["-D", *args], check=False)

    def _iptables(self, name: str, args: list[str], check: bool = True) -> None:
        run(self.command(name, ["iptables", "-w", *args]), check=check)

    def rules(self, name: str) -> list[str]:
        """Host ``name``'s iptables rules (``iptables -S``, the policies left out)."""
        out = run(self.command(name, ["iptables", "-w", "-S"]))
        return [line for line in out.splitlines() if not line.startswith("-P ")]

    def counters(self, name: str) -> tuple[int, int]:
        """Host ``name``'s bytes on the wire since it was made: ``(tx, rx)`` of its ``eth0`` (Ethernet frames)."""
        [link] = json.loads(run(["ip", "-j", "-s", "-n", self.host(name).netns, "link", "show", "eth0"]))
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


def _block_rules(address: str, port: int | None) -> list[list[str]]:
    """iptables rule specs (without ``-A``/``-D``) dropping traffic with ``address``, or only with its TCP
    ``port``, both ways."""
    out, into = ["OUTPUT", "-d", address], ["INPUT", "-s", address]
    if port is not None:
        out += ["-p", "tcp", "--dport", str(port)]
        into += ["-p", "tcp", "--sport", str(port)]
    return [[*out, "-j", "DROP"], [*into, "-j", "DROP"]]


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
