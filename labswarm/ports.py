"""Ports for servers started later: a port chosen now that no other process of the machine is likely to take first.

A port the kernel picks (a bind to port 0) lies in its ephemeral range, which it hands to every ``connect()`` and
every bind to port 0 of the machine: between the choice and the server's own bind, any of them can take it. Below
that range only another caller choosing at random can (the race seen in CI between parallel tests' managers,
shards and subprocesses).
"""

from __future__ import annotations

import contextlib
import random
import socket
from pathlib import Path

#: The start of the kernel's ephemeral port range where it cannot be read (Linux's default).
EPHEMERAL_START = 32768
_RANDOM = random.SystemRandom()


def _below_ephemeral() -> tuple[int, int]:
    """``(low, high)``: from half the kernel's ephemeral range's start to that start (16384-32768 with Linux's
    default; the start read from ``/proc/sys/net/ipv4/ip_local_port_range``, else :data:`EPHEMERAL_START`);
    ``low >= high`` where the range starts at 1024 or lower (``low`` is never below 1024, so a start of, say, 2000
    still gives 1024-1999)."""
    high = EPHEMERAL_START
    with contextlib.suppress(OSError, ValueError, IndexError):
        high = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    return max(high // 2, 1024), high


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free now on ``host``, for a server that binds it later (a process started with it).

    Picked at random below the kernel's ephemeral range, from half its start to its start (16384-32767 with
    Linux's default; the start read from ``/proc/sys/net/ipv4/ip_local_port_range``, else
    :data:`EPHEMERAL_START`): the kernel gives ports of that range to every ``connect()`` and every bind to port 0
    of the machine, so a port it picked could be taken by one of them before the server binds it; below the range
    only another caller choosing the same port at random can take it (never below 1024, the privileged ports). A
    range starting at 1024 or lower leaves no room below it: then the kernel picks (a bind to port 0), as before.

    Raises:
        OSError: no port of the range was free after 200 tries.
    """
    with listen_free(host, backlog=None) as sock:
        return int(sock.getsockname()[1])


def listen_free(host: str = "127.0.0.1", backlog: int | None = 128, port: int = 0) -> socket.socket:
    """A TCP socket bound to a free port of ``host`` below the kernel's ephemeral range (as :func:`free_port`
    picks), or to ``port`` where it is not 0, listening with ``backlog`` (``None``: bound only): for a server whose
    port must stay its own after it dies and is revived on it (with that ``port``: one bind path for both). A port
    the kernel picks lies in its ephemeral range, where any ``connect()`` of the machine may be given it as its
    local port while the server is down (a learner retrying to reach it, too: TCP's self-connect), and the revived
    server cannot bind it again. Where the range leaves no room below it, the kernel picks.

    The socket is IPv6 where ``host`` has a ``:`` (``"::1"``, ``"::"``), with ``IPV6_V6ONLY`` set as
    :func:`socket.create_server` sets it (``"::"`` is not dual-stack); IPv4 otherwise. A listening socket has
    ``SO_REUSEADDR`` (as :func:`socket.create_server`): a server's port binds again past TIME_WAIT.

    Raises:
        OSError: no port of the range was free after 200 tries; or ``port`` cannot be bound (taken, say).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    low, high = _below_ephemeral()
    randoms = [0] if low >= high else [_RANDOM.randrange(low, high) for _ in range(200)]  # not the global generator
    ports = [port] if port else randoms
    for candidate in ports:
        sock = socket.socket(family)
        try:
            if backlog is not None:  # as socket.create_server: a server's port binds again past TIME_WAIT
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and hasattr(socket, "IPV6_V6ONLY"):  # as socket.create_server
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((host, candidate))
            if backlog is not None:
                sock.listen(backlog)
        except OSError:
            sock.close()
            if len(ports) == 1:
                raise
            continue
        return sock
    raise OSError(f"no free port on {host} in {low}-{high - 1} after 200 tries")
