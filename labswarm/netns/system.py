"""The machine's side of the cluster harness (:mod:`labswarm.netns`): commands, the clusters' namespaces and
root-namespace links by name, and the sweep of what dead processes left."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Sequence

from labswarm.errors import LabswarmError

#: Namespace and root-interface name prefix of every cluster (:func:`sweep` looks for it).
PREFIX = "lsw"

_NAMESPACE = re.compile(rf"^{PREFIX}-(\d+)-(\d+)-(\S+)$")
_ROOT_LINK = re.compile(rf"^{PREFIX}(\d+)g(\d+)$")


class ClusterError(LabswarmError):
    """A cluster could not be made, changed or torn down (not root, a command failed, an unknown host or profile)."""


def run(argv: Sequence[str], check: bool = True) -> str:
    """Run a command; its stdout. Raises ClusterError with its stderr when it fails and ``check``."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ClusterError(f"{' '.join(argv)}: {exc}") from exc
    if check and done.returncode != 0:
        raise ClusterError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_namespace(name: str) -> None:
    """Kill every process inside namespace ``name``, then delete it."""
    for _ in range(50):
        pids = [int(p) for p in run(["ip", "netns", "pids", name], check=False).split()]
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)
    run(["ip", "netns", "delete", name], check=False)


def namespaces() -> list[str]:
    """Every cluster namespace on the machine (any process's)."""
    names = (line.split()[0] for line in run(["ip", "netns", "list"], check=False).splitlines() if line.strip())
    return sorted(n for n in names if _NAMESPACE.match(n))


def root_links() -> list[str]:
    """Every cluster interface in the root namespace (a gateway's veth; any process's)."""
    links = json.loads(run(["ip", "-j", "link", "show"], check=False) or "[]")
    return sorted(link["ifname"] for link in links if _ROOT_LINK.match(link.get("ifname", "")))


def sweep(all_: bool = False) -> list[str]:
    """Delete what clusters of dead processes left (namespaces, root veths; iptables rules live and die inside the
    namespaces), or, with ``all_``, every cluster's. Returns what was deleted."""
    gone = []
    for name in namespaces():
        match = _NAMESPACE.match(name)
        if match and (all_ or not alive(int(match.group(1)))):
            kill_namespace(name)
            gone.append(name)
    for link in root_links():
        match = _ROOT_LINK.match(link)
        if match and (all_ or not alive(int(match.group(1)))):
            run(["ip", "link", "delete", link], check=False)
            gone.append(link)
    return gone
