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


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free now on ``host``, for a server that binds it later (a process started with it).

    Picked at random below the kernel's ephemeral range, from half its start to its start (16384-32767 with
    Linux's default; the start read from ``/proc/sys/net/ipv4/ip_local_port_range``, else
    :data:`EPHEMERAL_START`): the kernel gives ports of that range to every ``connect()`` and every bind to port 0
    of the machine, so a port it picked could be taken by one of them before the server binds it; below the range
    only another caller choosing the same port at random can take it. A range starting at 2048 or lower leaves no
    room below it: then the kernel picks (a bind to port 0), as before.

    Raises:
        OSError: no port of the range was free after 200 tries.
    """
    high = EPHEMERAL_START
    with contextlib.suppress(OSError, ValueError, IndexError):
        high = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    low = max(high // 2, 1024)
    if low >= high:  # an ephemeral range from 1024-2048 or lower: no room below it, the kernel's choice then
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
            sock.bind((host, 0))
            return int(sock.getsockname()[1])
    for _ in range(200):
        port = _RANDOM.randrange(low, high)  # not the global generator: a test may have seeded it
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    raise OSError(f"no free port on {host} in {low}-{high - 1} after 200 tries")
