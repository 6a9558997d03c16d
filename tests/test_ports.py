"""labswarm.ports.free_port where the kernel's ephemeral range leaves no room below it."""

from __future__ import annotations

import socket

import pytest

from labswarm import ports


class _Range:
    """Stands for /proc/sys/net/ipv4/ip_local_port_range with the given text."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __call__(self, _path: str) -> _Range:
        return self

    def read_text(self) -> str:
        return self.text


@pytest.mark.parametrize("start", [1024, 2000])
def test_a_range_starting_low_gives_a_port_the_kernel_picks_not_a_value_error(monkeypatch: pytest.MonkeyPatch,
                                                                              start: int) -> None:
    monkeypatch.setattr(ports, "Path", _Range(f"{start}\t65000\n"))
    port = ports.free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))  # free


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
