"""labswarm.ports: free_port/listen_free below the kernel's ephemeral range (or the kernel's pick where it leaves no
room), and a revived server's bind of its own port, IPv4 and IPv6."""

from __future__ import annotations

import socket

import pytest

from labswarm import ports
from labswarm.train.distributed.ps import auth


class _Range:
    """Stands for /proc/sys/net/ipv4/ip_local_port_range with the given text."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __call__(self, _path: str) -> _Range:
        return self

    def read_text(self) -> str:
        return self.text


def test_a_range_starting_at_1024_gives_a_port_the_kernel_picks_and_one_at_2000_a_port_from_1024_below_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "Path", _Range("1024\t65000\n"))
    port = ports.free_port()  # the kernel's pick, not a ValueError from an empty range
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))  # free
    monkeypatch.setattr(ports, "Path", _Range("2000\t65000\n"))
    assert all(1024 <= ports.free_port() < 2000 for _ in range(10))


def test_a_range_starting_high_gives_a_port_below_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "Path", _Range("40000\t60999\n"))
    assert all(20000 <= ports.free_port() < 40000 for _ in range(10))


def test_a_server_listens_below_the_ephemeral_range_and_its_port_can_be_bound_again_once_closed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "Path", _Range("40000\t60999\n"))
    with ports.listen_free("127.0.0.1") as server:
        port = server.getsockname()[1]
        assert 20000 <= port < 40000
        with socket.create_connection(("127.0.0.1", port), timeout=10):
            pass  # it listens
    with socket.create_server(("127.0.0.1", port)):
        pass  # a revived server binds it again


def _ipv6_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_a_shard_listens_on_a_free_port_and_a_revived_one_binds_that_port_again(monkeypatch: pytest.MonkeyPatch,
                                                                               host: str) -> None:
    if host == "::1" and not _ipv6_loopback():
        pytest.skip("this host has no IPv6 loopback")
    monkeypatch.setattr(ports, "Path", _Range("40000\t60999\n"))
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with auth.listen(host, 0, None) as shard:
        port = shard.getsockname()[1]
        assert 20000 <= port < 40000
        assert shard.family == family
        with socket.create_connection((host, port), timeout=10):
            pass  # it listens
    with auth.listen(host, port, None) as revived:  # the port it had, as a revived shard binds it
        assert revived.getsockname()[1] == port and revived.family == family
        if family == socket.AF_INET6:  # as socket.create_server: not dual-stack
            assert revived.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 1
        with socket.create_connection((host, port), timeout=10):
            pass
        with pytest.raises(OSError):  # taken: the one bind path raises, it does not pick another port
            auth.listen(host, port, None)
