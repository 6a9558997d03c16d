"""``labswarm compare --hosts``: a comparison's learners and parameter-server shards on machines the user names,
the manager (and each job's coordinator store) on this machine at an address they reach.

Placement: learner rank ``r`` of every job runs on ``hosts[r % len(hosts)]``, the shards on the last host (with
more hosts than learners, a host of their own). Each runs through the host command, a template with ``{host}``
(the host's name as given) and ``{address}`` (its address) placeholders: ``ssh -tt -o BatchMode=yes {host}`` by default
(keys, no prompt), ``ip netns exec {host}`` for the namespaces of :mod:`labswarm.netns`, ``srun -w {host}`` or
``docker exec {host}``. The command that follows it is ``PYTHON -m labswarm.compare.host_env ENV_FILE -m MODULE
ARGS``: the process's own variables (the attempt's token, ``RANK``, ``MASTER_ADDR``, the shard secret) are read
from a file readable by its owner only (:mod:`labswarm.compare.host_env`), none on a command line; its words are
refused unless a remote shell would leave them as they are (``ssh`` joins them into one line).

What the hosts must share with this machine, at the same paths: the interpreter with labswarm installed
(``PYTHON``, default this one's), the experiment's data and store folders, and the comparison's workdir (specs, env
files, results, the shards' checkpoints): an NFS mount, or one filesystem for namespaces. A halt or kill reaches
the host command's process (with ``ip netns exec``, the learner itself; with ``ssh``, the client, whose end closes
the connection: the default's ``-tt`` hangs the remote learner up with it; without it the learner would run on,
beside its replacement).
"""

from __future__ import annotations

import json
import os
import shlex
import string
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from labswarm.deploy.learners import LearnerLaunch
from labswarm.deploy.local_learners import LocalLearners
from labswarm.errors import ConfigError, DeployError
from labswarm.jobs.lifecycle.cluster import LocalShards

#: The host command when none is given: ssh with keys only (a password prompt would hang the job) and a terminal
#: (``-tt``), so that the remote learner is hung up when a halt or kill ends the client.
DEFAULT_HOST_COMMAND = "ssh -tt -o BatchMode=yes {host}"
#: The placeholders a host command may use.
PLACEHOLDERS = ("host", "address")
#: The first parameter-server shard's port on its host (shard ``k`` on ``SHARD_PORT + k``).
SHARD_PORT = 29600
#: The module every placed process starts with (:mod:`labswarm.compare.host_env`).
ENV_MODULE = "labswarm.compare.host_env"


@dataclass(frozen=True)
class Hosts:
    """The machines of a comparison and how to run a process on each.

    Attributes:
        names: the hosts, as the host command names them (``{host}``), in placement order.
        addresses: each host's address as the others reach it (``{address}``; a shard listens there).
        command: the host command's words, placeholders unfilled.
        address: this machine's address as the hosts reach it: the manager and the coordinator listen there.
        python: the interpreter the hosts run (the same path on each).
        env: variables added on every host (e.g. ``GLOO_SOCKET_IFNAME``, the interface gloo uses there).
    """

    names: tuple[str, ...]
    addresses: tuple[str, ...]
    command: tuple[str, ...]
    address: str
    python: str = sys.executable
    env: dict[str, str] = field(default_factory=dict)

    def learner_host(self, rank: int) -> int:
        """The index of learner ``rank``'s host: ``rank % len(names)``."""
        return rank % len(self.names)

    @property
    def shard_host(self) -> int:
        """The index of the shards' host: the last one."""
        return len(self.names) - 1

    def on(self, index: int, argv: Sequence[str], env: dict[str, str], env_file: Path) -> list[str]:
        """``python -m MODULE ARGS`` (``argv``, its interpreter left out) as run on host ``index``, its variables
        ``env`` (and :attr:`env`) written to ``env_file`` (mode 0600).

        Raises:
            DeployError: a word of the command a remote shell would change (spaces, quotes, ``$``...).
        """
        words = [self.python, "-m", ENV_MODULE, str(env_file), *argv[1:]]
        bad = [w for w in words if shlex.quote(w) != w]
        if bad:
            raise DeployError(f"host command: {bad[0]!r} holds characters a remote shell would change; use paths "
                              "without spaces or quotes")
        env_file.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(env_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump({**env, **self.env}, handle)
        fill = {"host": self.names[index], "address": self.addresses[index]}
        return [w.format(**fill) for w in self.command] + words

    def place_learner(self, launch: LearnerLaunch, argv: list[str], env: dict[str, str]) -> list[str]:
        """:attr:`LocalLearners.place <labswarm.deploy.local_learners.LocalLearners.place>`: the learner on its host,
        with the variables the launcher set or changed (those of this machine's environment are the host's own)."""
        own = {k: v for k, v in env.items() if os.environ.get(k) != v}
        return self.on(self.learner_host(launch.rank), argv, own, launch.spec_path.with_suffix(".env"))


def parse_hosts(hosts: str | Sequence[str], address: str | None, command: str = DEFAULT_HOST_COMMAND,
                python: str | None = None, env: dict[str, str] | None = None) -> Hosts:
    """The hosts of ``--hosts b,c`` (or ``b=10.0.0.2,c=10.0.0.3``: a name and its address; without ``=``, the name is
    the address) with ``--host-command`` and ``--address``.

    Raises:
        ConfigError: no host, an empty or repeated name (field ``hosts``); a command that is empty, does not parse,
            or uses a placeholder other than ``{host}``/``{address}`` (field ``host-command``); no address (field
            ``address``).
    """
    items = [h.strip() for h in (hosts.split(",") if isinstance(hosts, str) else hosts)]
    if not any(items):
        raise ConfigError([("hosts", "name at least one host (b,c or b=10.0.0.2,c=10.0.0.3)")])
    pairs = [(name.strip(), (addr if eq else name).strip()) for name, eq, addr in (h.partition("=") for h in items)]
    for name, addr in pairs:
        if not name or not addr:
            raise ConfigError([("hosts", f"an empty host name or address in {hosts!r}")])
    names = [name for name, _ in pairs]
    if len(set(names)) < len(names):
        raise ConfigError([("hosts", f"a host is named twice in {hosts!r}")])
    try:
        words = shlex.split(command)
        fields = {f for w in words for _, f, _, _ in string.Formatter().parse(w) if f is not None}
    except ValueError as exc:
        raise ConfigError([("host-command", f"{command!r} does not parse: {exc}")]) from None
    if not words:
        raise ConfigError([("host-command", "empty; e.g. 'ssh {host}'")])
    unknown = sorted(fields - set(PLACEHOLDERS))
    if unknown:
        raise ConfigError([("host-command", f"unknown placeholder {{{unknown[0]}}} in {command!r}; known: "
                                            + ", ".join(f"{{{p}}}" for p in PLACEHOLDERS))])
    if not address:
        raise ConfigError([("address", "the address of this machine the hosts reach (the manager and the jobs' "
                                       "coordinator listen there)")])
    return Hosts(tuple(names), tuple(addr for _, addr in pairs), tuple(words), address,
                 python or sys.executable, dict(env or {}))


class HostShards(LocalShards):
    """A job's parameter-server shards on the shards' host (:attr:`Hosts.shard_host`), listening on its address
    (ports from :data:`SHARD_PORT`), checkpointing into ``home/ps`` (shared); the coordinator stays in the manager
    on :attr:`Hosts.address`."""

    def __init__(self, job_id: str, home: Path, hosts: Hosts) -> None:
        super().__init__(job_id, home, hosts.address)
        self.hosts = hosts

    def address(self, index: int) -> tuple[str, int]:
        """``(the shards' host's address, SHARD_PORT + index)``."""
        return self.hosts.addresses[self.hosts.shard_host], SHARD_PORT + index

    def start(self, index: int, argv: list[str], env: dict[str, str], wait: bool = True) -> None:
        """Start shard ``index`` on its host (:meth:`LocalShards.start`, through the host command)."""
        own = {**env, "OMP_NUM_THREADS": "1"}
        command = self.hosts.on(self.hosts.shard_host, argv, own, self.checkpoint_dir / f"shard-{index}.env")
        super().start(index, command, {}, wait)


def place(launcher: object, hosts: Hosts, home: Path) -> None:
    """Make an embedded manager's launcher (``launcher``, local) start learners and shards on ``hosts``; the
    shards' folders under ``home``.

    Raises:
        ConfigError: the launcher is not the local one (field ``hosts``).
    """
    if not isinstance(launcher, LocalLearners):
        raise ConfigError([("hosts", "the learners' hosts are placed by the local launcher only")])
    launcher.place = hosts.place_learner
    runner: Callable[[str], HostShards] = lambda job_id: HostShards(job_id, home / job_id, hosts)  # noqa: E731
    setattr(launcher, "shard_runner", runner)  # noqa: B010 (the deployer's optional hook)
