"""The container health check of every role: ``python -m labswarm.deploy.healthcheck [ROLE]``.

One image runs every role, so the check finds the role's process in the container (whatever its PID: behind
``docker-init`` or not; an init process such as ``docker-init`` or ``tini`` is never taken for the role it
starts) and checks what that role must be doing:

- ``manager``: ``GET /health`` on its ``--host`` (the loopback for a wildcard) and ``--port`` answers 200;
- ``health``: ``GET /health`` on its ``--metrics-host`` and ``--metrics-port`` answers 200
  (without that option: the loop is alive);
- ``worker``: the Celery pool has started (the worker fetched its configuration, warmed up and forked) and the
  worker holds an established TCP connection (the broker);
- ``learner`` (``python -m labswarm.jobs.learner.entry SPEC``, a job's learner): its process runs (the jobs'
  lifecycle watches its heartbeats and restarts it by the manifest's policy: the container must not be replaced
  behind the lifecycle's back);
- ``shard`` (``python -m labswarm.train.distributed.ps``, a parameter-server shard): it listens on a TCP port.

Exit status 0 when healthy, 1 otherwise, with one line saying why (Docker keeps it in ``docker inspect``).
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from pathlib import PurePath

#: The roles of the labswarm image that are ``labswarm`` subcommands.
COMMANDS = ("manager", "worker", "health")
#: The roles that are Python modules run with ``python -m``, by module.
MODULES = {"labswarm.jobs.learner.entry": "learner", "labswarm.train.distributed.ps": "shard"}
#: Every role the check knows.
ROLES = (*COMMANDS, *MODULES.values())
#: Init processes that start a container's command (``docker run --init``, compose's ``init: true``, swarm's
#: services): their command line holds the role's, but they are not the role's process.
INITS = frozenset({"docker-init", "tini", "dumb-init"})
#: Seconds an HTTP probe may take.
TIMEOUT_S = 5.0


def role_of(cmdline: Sequence[str]) -> tuple[str, list[str]] | None:
    """The role and its arguments if ``cmdline`` runs ``labswarm <role> ...`` (the script or ``-m labswarm.cli``)
    or one of :data:`MODULES` (``python -m MODULE ...``).

    Returns:
        ``(role, args after the role)``, or ``None`` for any other command (e.g. ``labswarm health plot``).
    """
    for i, token in enumerate(cmdline):
        if token in MODULES and i > 0 and cmdline[i - 1] == "-m":
            return MODULES[token], list(cmdline[i + 1:])
        if i == len(cmdline) - 1:
            break
        is_script = PurePath(token).name == "labswarm"
        is_module = token == "labswarm.cli" and i > 0 and cmdline[i - 1] == "-m"
        if is_script or is_module:
            role, args = cmdline[i + 1], list(cmdline[i + 2:])
            if role in COMMANDS and not (role == "health" and args[:1] == ["plot"]):
                return role, args
            return None
    return None


def option(args: Sequence[str], name: str, default: str | None = None) -> str | None:
    """The value of ``--name VALUE`` or ``--name=VALUE`` in ``args``, else ``default``."""
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return default


def probe(url: str) -> str | None:
    """``None`` if ``GET url`` answers 200, else why not."""
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            return None if response.status == 200 else f"{url} answered {response.status}"
    except (urllib.error.URLError, OSError) as exc:
        return f"{url}: {exc}"


def find(processes: Iterable[tuple[int, Sequence[str]]], wanted: str | None) -> tuple[int, str, list[str]] | None:
    """The first ``(pid, role, args)`` among ``(pid, cmdline)`` pairs running a labswarm role (``wanted`` if set);
    an init process (:data:`INITS`) is skipped: the role's process is its child."""
    for pid, cmdline in sorted(processes):
        if cmdline and PurePath(cmdline[0]).name in INITS:
            continue
        found = role_of(cmdline or [])
        if found and (wanted is None or found[0] == wanted):
            return pid, found[0], found[1]
    return None


def check_worker(pid: int) -> str | None:
    """``None`` if the worker ``pid`` has forked its pool and holds an established TCP connection."""
    import psutil

    try:
        process = psutil.Process(pid)
        if not process.children():
            return "the worker's pool has not started (still fetching its configuration or warming up?)"
        connections = process.net_connections(kind="tcp")
    except psutil.Error as exc:
        return f"cannot inspect the worker process {pid}: {exc}"
    if not any(c.status == psutil.CONN_ESTABLISHED for c in connections):
        return "the worker has no established connection to the broker"
    return None


#: Addresses that bind every interface: the process is probed on the loopback.
WILDCARDS = frozenset({"", "0.0.0.0", "::", "*"})


def probe_host(host: str | None) -> str:
    """The host part of a URL that reaches a process bound to ``host`` (its ``--host`` / ``--metrics-host``):
    the loopback for a wildcard or no option (the roles' default, 127.0.0.1), else that address (bracketed
    when IPv6): a process bound to one address answers there only."""
    if host is None or host in WILDCARDS:
        return "[::1]" if host == "::" else "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def check_listening(pid: int) -> str | None:
    """``None`` if process ``pid`` listens on a TCP port (a shard accepting its learners), else why not."""
    import psutil

    try:
        connections = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error as exc:
        return f"cannot inspect the process {pid}: {exc}"
    if not any(c.status == psutil.CONN_LISTEN for c in connections):
        return "the shard listens on no port yet"
    return None


def check(role: str, pid: int, args: Sequence[str]) -> str | None:
    """``None`` if the ``role`` process ``pid`` started with ``args`` is healthy, else why not."""
    if role == "manager":
        return probe(f"http://{probe_host(option(args, '--host'))}:{option(args, '--port', '8000')}/health")
    if role == "health":
        port = option(args, "--metrics-port")
        host = probe_host(option(args, "--metrics-host"))
        return probe(f"http://{host}:{port}/health") if port else None  # /metrics may need the scrape token
    if role == "learner":
        return None  # found running: the jobs' lifecycle judges a learner by its heartbeats
    if role == "shard":
        return check_listening(pid)
    return check_worker(pid)


def main(argv: Sequence[str] | None = None) -> int:
    """Check the labswarm process of this container; exit status 0 if healthy, 1 if not."""
    import psutil

    argv = list(sys.argv[1:] if argv is None else argv)
    wanted = argv[0] if argv else None
    if wanted is not None and wanted not in ROLES:
        print(f"unknown role {wanted!r}; one of {', '.join(ROLES)}")
        return 1
    processes = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        processes.append((process.info["pid"], process.info["cmdline"] or []))
    found = find(processes, wanted)
    if found is None:
        print(f"no labswarm {wanted or ', '.join(ROLES)} process in this container")
        return 1
    pid, role, args = found
    problem = check(role, pid, args)
    print(f"{role}: {problem or 'healthy'}")
    return 1 if problem else 0


if __name__ == "__main__":
    sys.exit(main())
