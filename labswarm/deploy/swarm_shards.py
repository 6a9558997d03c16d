"""A distributed job's parameter-server shards as docker swarm services (``LABSWARM_JOB_LAUNCHER=swarm``): the
shard runner of :class:`~labswarm.jobs.lifecycle.cluster.JobCluster` on a swarm (the local one runs processes).

Shard ``k`` of a job is the service ``labswarm-job-<job>-ps-<k>`` (:func:`~labswarm.deploy.swarm_jobs.
ps_service_name`): 1 replica, restart ``none`` (the lifecycle revives a dead shard, counted as a platform restart),
the learners' image, network, data mount and placement constraints, labelled ``labswarm.managed``, the job and
``labswarm.shard``. Where it listens and how the learners reach it depends on ``swarm_network``:

- **an overlay network** (``labswarm`` in ``docker/compose.yml``): every service has its own address, so the
  shard listens on every interface of its container on the fixed :data:`PS_PORT`, and the learners reach it by
  its service name (``LABSWARM_PS_ADDRS=labswarm-job-<job>-ps-0:29600,...``): a revived shard, on any node, is
  found again under its name;
- **the host network** (``host``: :data:`HOST_NETWORK`, ``docker/compose.host.yml``, a machine without overlay
  networks): containers share their node's addresses and ports, and no service name resolves. Each shard gets
  its own port, free on the manager's node when the job first asks for it and kept for the job's life (as a
  local shard's, :class:`~labswarm.jobs.lifecycle.cluster.LocalShards`); it is placed on that node (a
  ``node.id==`` constraint: the node of the engine the manager talks to, its own through the engine's socket)
  and listens on the manager's address as the containers reach it (the host of ``swarm_manager_url``, which is
  also the coordinator's ``MASTER_ADDR``: ``127.0.0.1`` on one machine, the node's address on a cluster). A
  revived shard gets the same node, address and port, so the learners' ``LABSWARM_PS_ADDRS`` (and the
  attempt's ``started`` event, which records them) stay right for the job's life. A shard whose port another
  process took meanwhile exits at once and is revived again within the job's platform restart budget.

The shard checkpoints into :func:`shard_checkpoint_dir`, a folder of the shared data volume
(``<swarm_data_target>/.labswarm-jobs/<job>/ps``) that every node mounts, so a shard restarted on another node
resumes from its checkpoint. A delete of the job removes that folder where the manager sees it
(:func:`manager_view`): the host folder of a bind mount, else the volume mounted at the same path
(``docker/compose.yml`` does).

The environment :func:`~labswarm.train.distributed.launch.plan_attempt` gives a shard (e.g. a per-job parameter-server
secret) reaches it as a docker **secret** ``<service>-env`` (``NAME='value'`` lines loaded by its command before
it execs the shard), never in the service's spec, as for the learners.
"""

from __future__ import annotations

import contextlib
import logging
import shlex
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from labswarm.deploy.swarm import RestartSpec, ServiceSpec, data_mount, docker_sdk, translate_errors
from labswarm.deploy.swarm_jobs import KILL_GRACE_S, LABEL_JOB, LABEL_SHARD, JobServices, ps_service_name, task_status
from labswarm.deploy.swarm_secrets import LABEL_MANAGED, SecretSpec
from labswarm.errors import DeployError
from labswarm.ports import free_port

if TYPE_CHECKING:
    from labswarm.settings import Settings

log = logging.getLogger(__name__)

#: The port every shard listens on in its own container on an overlay network (each service has its own address).
PS_PORT = 29600
#: The ``swarm_network`` of containers on their node's own network stack (no overlay, no service names).
HOST_NETWORK = "host"
#: The file name under ``/run/secrets`` of a shard's secret environment.
PS_ENV_TARGET = "labswarm_ps_env"
#: Seconds a shard's task may take to reach ``running`` (image pull, placement) before the deploy fails.
SHARD_RUNNING_S = 120.0
#: Seconds between two reads of a starting shard's task state.
POLL_S = 0.2


def manager_host(settings: Settings) -> str:
    """The manager's address as the containers reach it: the host of ``swarm_manager_url`` (the URL the workers
    and learners already use, e.g. ``manager`` for ``http://manager:8000``); the job's coordinator listens on
    every interface of the manager, so the learners reach it there (``MASTER_ADDR``).

    Raises:
        ValueError: ``swarm_manager_url`` has no host.
    """
    host = urlparse(settings.swarm_manager_url).hostname
    if not host:
        raise ValueError(f"swarm_manager_url has no host: {settings.swarm_manager_url!r}")
    return host


def shard_checkpoint_dir(settings: Settings, job_id: str) -> Path:
    """Where a job's shards checkpoint, in their containers: ``<swarm_data_target>/.labswarm-jobs/<job>/ps``."""
    return Path(settings.swarm_data_target) / ".labswarm-jobs" / job_id / "ps"


def manager_view(settings: Settings, path: Path) -> Path:
    """``path`` of the shared data volume (as the containers see it) as the manager sees it: under the host folder
    when ``swarm_data_volume`` is one (a bind mount), else the same path (the manager mounts the volume where the
    containers do, as ``docker/compose.yml`` does).

    Raises:
        ValueError: ``path`` is not under ``swarm_data_target``.
    """
    if settings.swarm_data_volume.startswith("/"):
        return Path(settings.swarm_data_volume) / path.relative_to(settings.swarm_data_target)
    return path


def shard_arguments(argv: list[str], host: str | None = "0.0.0.0") -> list[str]:
    """The shard's arguments after ``-m labswarm.train.distributed.ps`` in a plan's command line, its ``--host``
    replaced by ``host``: default every interface (``0.0.0.0``) of the shard's own container on an overlay network,
    rather than the address the learners are given (a service name); ``None`` keeps the plan's (the host network:
    the address the learners are given is the node's own).

    Raises:
        ValueError: ``argv`` does not run ``labswarm.train.distributed.ps``.
    """
    try:
        args = list(argv[argv.index("labswarm.train.distributed.ps") + 1:])
    except ValueError:
        raise ValueError(f"not a parameter-server command line: {argv!r}") from None
    if host is not None and "--host" in args:
        args[args.index("--host") + 1] = host
    return args


def shard_service_spec(job_id: str, index: int, argv: list[str], settings: Settings,
                       node_id: str | None = None) -> ServiceSpec:
    """The service of shard ``index`` of ``job_id``, as data (see the module docstring). On the host network
    (:data:`HOST_NETWORK`) the shard keeps the plan's ``--host`` and ``--port`` (the address the learners are
    given) and, with ``node_id``, is placed on that node (``node.id==<node_id>``) besides ``swarm_constraints``.

    Raises:
        ValueError: ``argv`` is not a shard's command line, or an invalid ``swarm_data_nfs``.
    """
    name = ps_service_name(job_id, index)
    host_network = settings.swarm_network == HOST_NETWORK
    args = shard_arguments(argv, host=None if host_network else "0.0.0.0")
    script = (f"set -a && . /run/secrets/{PS_ENV_TARGET} && set +a && "
              f"exec python -m labswarm.train.distributed.ps {shlex.join(args)}")
    pinned = (f"node.id=={node_id}",) if host_network and node_id else ()
    return ServiceSpec(
        name=name,
        image=settings.swarm_image,
        command=("sh", "-c", script),
        network=settings.swarm_network,
        replicas=1,
        mounts=(data_mount(settings),),
        env={"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"},
        restart=RestartSpec(condition="none", delay_s=0.0, max_attempts=0),
        labels={LABEL_MANAGED: "true", LABEL_JOB: job_id, LABEL_SHARD: str(index)},
        constraints=(*settings.swarm_constraints, *pinned),
        stop_grace_s=KILL_GRACE_S,
        secrets=(SecretSpec(f"{name}-env", PS_ENV_TARGET, "LABSWARM_PS_ENV"),),
    )


class SwarmShards:
    """The shards of one job as swarm services (the shard runner :class:`~labswarm.jobs.lifecycle.cluster.JobCluster`
    uses on a swarm; see the module docstring).

    Args:
        engine: the engine client and the ``swarm_*`` settings (the job's learner launcher,
            :meth:`~labswarm.deploy.swarm_learners.SwarmLearners.shard_runner`).
        job_id: the job.
    """

    #: The coordinator's own address in the manager (its store listens on every interface).
    bind_host = "127.0.0.1"

    def __init__(self, engine: JobServices, job_id: str) -> None:
        self.engine = engine
        self.settings = engine.settings
        self.job_id = job_id
        self.master_host = manager_host(self.settings)
        self.checkpoint_dir = shard_checkpoint_dir(self.settings, job_id)
        #: whether the containers are on their node's network (:data:`HOST_NETWORK`): a port per shard
        self.host_network = self.settings.swarm_network == HOST_NETWORK
        #: the service id of each shard started (and not removed) by this runner
        self.services: dict[int, str] = {}
        self._codes: dict[int, int | None] = {}
        self._ports: dict[int, int] = {}  # the host network: each shard's port, chosen once for the job
        self._node: str | None = None  # the host network: the manager's node, where the shards run

    def address(self, index: int) -> tuple[str, int]:
        """Shard ``index``'s address as the learners reach it, the same for the job's life: on an overlay network
        its service name and :data:`PS_PORT`; on the host network the manager's address (``master_host``) and a
        port of its own (:func:`free_port`, chosen at the first call)."""
        if not self.host_network:
            return ps_service_name(self.job_id, index), PS_PORT
        if index not in self._ports:
            self._ports[index] = free_port("")
        return self.master_host, self._ports[index]

    def node(self) -> str | None:
        """On the host network, the id of the node of the engine the manager talks to (where its shards run:
        their address is the manager's), read once; ``None`` on an overlay network.

        Raises:
            DeployError: the engine cannot be reached or is not a swarm node.
        """
        if self.host_network and self._node is None:
            with translate_errors("read the swarm node of the manager's engine"):
                node = ((self.engine.client.info() or {}).get("Swarm") or {}).get("NodeID")
            if not node:
                raise DeployError("the manager's Docker engine is not a swarm node (docker swarm init)")
            self._node = str(node)
        return self._node

    def start(self, index: int, argv: list[str], env: dict[str, str], wait: bool = True) -> None:
        """Create shard ``index``'s secret and service (a stale one of this job under the name is removed first);
        with ``wait``, until its task runs (the DLaaS order: the server before the learners).

        Raises:
            DeployError: the engine refused or could not be reached, a foreign service or secret has the name, or
                the task failed or did not run within :data:`SHARD_RUNNING_S`; nothing of the shard is left.
        """
        try:
            spec = shard_service_spec(self.job_id, index, argv, self.settings, self.node())
        except ValueError as exc:
            raise DeployError(f"parameter-server shard {index}: {exc}") from exc
        client = self.engine.client
        data = "".join(f"{k}={shlex.quote(v)}\n" for k, v in sorted(env.items())).encode()
        with translate_errors(f"create parameter-server service {spec.name}"):
            self.engine.remove_named(spec.name, self.job_id, check=True)
            try:
                secret = client.secrets.create(name=spec.secrets[0].name, labels=spec.labels, data=data)
                service = client.services.create(**spec.to_docker({secret.name: secret.id}))
            except Exception:
                with contextlib.suppress(Exception):  # best effort: the original error is what matters
                    self.engine.remove_named(spec.name, self.job_id)
                raise
        self.services[index] = service.id
        self._codes.pop(index, None)
        log.info("job %s: parameter-server shard %d is service %s (%s)", self.job_id, index, spec.name, service.id)
        deadline = time.monotonic() + SHARD_RUNNING_S
        while wait:
            state = self._state(index)
            if state == "running":
                return
            if state != "starting" or time.monotonic() > deadline:
                self.remove(index)
                raise DeployError(f"parameter-server shard {index} of job {self.job_id} did not start: its task is "
                                  f"{state}")
            time.sleep(POLL_S)

    def _state(self, index: int) -> str:
        """``running``, ``starting`` (before it), or how it ended (the exit code kept for :meth:`exit_code`)."""
        try:
            with translate_errors(f"read the tasks of parameter-server service {self.services[index]}"):
                try:
                    tasks = self.engine.client.services.get(self.services[index]).tasks()
                except docker_sdk().errors.NotFound:
                    self._codes[index] = None
                    return "gone"
        except DeployError as exc:
            log.warning("job %s shard %d: %s (taken as alive)", self.job_id, index, exc)
            return "running"
        status = task_status(tasks)
        if status.alive:
            states = [(t.get("Status") or {}).get("State") for t in tasks]
            return "running" if "running" in states else "starting"
        self._codes[index] = status.exit_code
        return "rejected" if status.deploy_failed else "ended"

    def running(self, index: int) -> bool:
        """Whether shard ``index`` was started and its task has not ended."""
        return index in self.services and self._state(index) in ("running", "starting")

    def dead(self) -> list[int]:
        """The shards whose task ended (or whose service vanished)."""
        return [k for k in list(self.services) if self._state(k) not in ("running", "starting")]

    def exit_code(self, index: int) -> int | None:
        """The exit code of shard ``index``'s ended task (``None``: unknown or not ended)."""
        return self._codes.get(index)

    def remove(self, index: int) -> None:
        """Remove shard ``index``'s service and secret (an engine error is logged: the job's delete or the next
        manager's sweep removes them)."""
        self.services.pop(index, None)
        try:
            with translate_errors(f"remove parameter-server service {ps_service_name(self.job_id, index)}"):
                self.engine.remove_named(ps_service_name(self.job_id, index), self.job_id)
        except DeployError as exc:
            log.warning("job %s shard %d: %s", self.job_id, index, exc)

    def stop(self) -> None:
        """Remove every shard's service and secret."""
        for index in list(self.services):
            self.remove(index)

    def discard(self) -> None:
        """Remove the job's folder of the shared volume, the shards' checkpoints in it (a delete), where the
        manager sees it (:func:`manager_view`: under the host folder of a bind mount)."""
        shutil.rmtree(manager_view(self.settings, self.checkpoint_dir.parent), ignore_errors=True)

    def handles(self) -> dict[str, Any]:
        """What the attempt's ``started`` event records of the shards: their service ids."""
        return {"ps_services": [self.services[k] for k in sorted(self.services)]}
