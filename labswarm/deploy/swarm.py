"""Workers as a docker swarm service: one replicated service per experiment session, created, scaled and
removed by the manager through the Docker engine API (PyPI ``docker``, the ``swarm`` extra).

The service specification is plain data (:class:`~labswarm.deploy.swarm_spec.ServiceSpec`, built by
:func:`service_spec` from the settings), so what the manager asks the engine for is testable without an engine;
the data and the engine helpers live in :mod:`labswarm.deploy.swarm_spec` and are re-exported here. Every error
of the engine or of the connection to it becomes a :class:`~labswarm.errors.DeployError` naming the service.

Secrets (the API token, a broker URL with a password) never travel in the service's ``Env`` or command line,
which ``docker service inspect`` shows: the launcher stores each as a docker secret (:func:`secret_values`) and
the containers read it from ``/run/secrets/...`` through ``LABSWARM_<NAME>_FILE`` (see :mod:`labswarm.settings`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from labswarm.deploy.base import Launcher
from labswarm.deploy.swarm_secrets import LABEL_MANAGED, SecretSpec, worker_secrets
from labswarm.deploy.swarm_spec import (
    INSTALL_HINT,
    LABEL_EXPERIMENT,
    LABEL_SESSION,
    MAX_NAME,
    SERVICE_PREFIX,
    ConfigSpec,
    MountSpec,
    ResourceSpec,
    RestartSpec,
    ServiceSpec,
    docker_sdk,
    engine_client,
    service_labels,
    service_name,
    translate_errors,
)
from labswarm.errors import DeployError
from labswarm.redact import has_password

if TYPE_CHECKING:
    from labswarm.settings import Settings

__all__ = [
    "INSTALL_HINT", "LABEL_EXPERIMENT", "LABEL_MANAGED", "LABEL_SESSION", "MAX_NAME", "SERVICE_PREFIX",
    "WORKERS_TTL", "WORKER_ENV",
    "ConfigSpec", "MountSpec", "ResourceSpec", "RestartSpec", "SecretSpec", "ServiceSpec", "SwarmLauncher",
    "data_mount", "docker_sdk", "engine_client", "service_labels", "service_name", "service_spec",
    "translate_errors", "worker_command",
]

#: Environment of every worker container: one maths thread per pool process (see the runbook).
WORKER_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
#: Seconds :attr:`SwarmLauncher.workers` keeps its count of running containers: the dashboard's overview asks for
#: it every 2 s per session, and each answer costs two engine calls (find the service, list its tasks); a
#: start, a scale or a stop forgets it. Containers take seconds to start or stop anyway.
WORKERS_TTL = 5.0


def worker_command(experiment: str, settings: Settings) -> tuple[str, ...]:
    """The command line of one worker container of ``experiment`` (``labswarm worker ...``)."""
    command = ["labswarm", "worker", "--experiment", experiment, "--manager", settings.swarm_manager_url,
               "--concurrency", str(settings.swarm_concurrency)]
    return tuple(command)  # the broker URL and the token are secrets: see service_spec


def data_mount(settings: Settings) -> MountSpec:
    """The shared data mount of the worker containers, from the ``swarm_data_*`` settings.

    An absolute ``swarm_data_volume`` is a host folder (bind mount); otherwise a named volume, made an NFS
    volume on each node when ``swarm_data_nfs`` (``HOST:/export``) is set.

    Raises:
        ValueError: ``swarm_data_nfs`` is not ``HOST:/path``.
    """
    source, target = settings.swarm_data_volume, settings.swarm_data_target
    if source.startswith("/"):
        return MountSpec(source, target, type="bind")
    if not settings.swarm_data_nfs:
        return MountSpec(source, target)
    host, sep, export = settings.swarm_data_nfs.partition(":")
    if not (host and sep and export.startswith("/")):
        raise ValueError(f"swarm_data_nfs must be HOST:/export/path, got {settings.swarm_data_nfs!r}")
    options = {"type": "nfs", "o": f"addr={host},{settings.swarm_data_nfs_options}".rstrip(","),
               "device": f":{export}"}
    return MountSpec(source, target, driver_options=options)


def service_spec(experiment: str, session_id: str, settings: Settings, replicas: int = 0) -> ServiceSpec:
    """The worker service of one session of ``experiment``, as data.

    Args:
        experiment: the experiment name; the workers consume its queue.
        session_id: the session the service belongs to (a label: only that session's end removes it).
        settings: image, network, manager and broker URLs, data mount, constraints (``swarm_*``) and the API
            token the workers need (these two as docker secrets, :func:`secret_values`; a broker URL without a
            password as ``LABSWARM_BROKER_URL``).
        replicas: worker containers.

    Raises:
        ValueError: ``replicas`` < 0, or an invalid ``swarm_data_nfs``.
    """
    env = dict(WORKER_ENV)
    secrets = tuple(spec for spec, _value in worker_secrets(settings))
    for secret in secrets:
        env[f"{secret.variable}_FILE"] = f"/run/secrets/{secret.target}"
    broker = settings.swarm_broker_url
    if broker and not has_password(broker):
        env["LABSWARM_BROKER_URL"] = broker
    spec = ServiceSpec(
        name=service_name(experiment),
        image=settings.swarm_image,
        command=worker_command(experiment, settings),
        network=settings.swarm_network,
        replicas=0,
        mounts=(data_mount(settings),),
        env=env,
        labels={LABEL_MANAGED: "true", LABEL_EXPERIMENT: experiment, LABEL_SESSION: session_id},
        constraints=tuple(settings.swarm_constraints),
        stop_grace_s=settings.swarm_stop_grace,
        secrets=secrets,
    )
    return spec.with_replicas(replicas)


class SwarmLauncher(Launcher):
    """The workers of one session as a replicated docker swarm service.

    Stateless beyond its specification: the service is found by name, so a restarted manager rebuilds the
    launcher of a session from the settings and finds the service the previous process created.

    Args:
        spec: the service to run (:func:`service_spec`); its ``replicas`` are replaced by :meth:`start`'s.
        client: a ``docker.DockerClient``; default ``docker.from_env()`` on first use (``DOCKER_HOST`` or
            ``/var/run/docker.sock``).
        secrets: the value of each secret the spec references, by name (:func:`secret_values`); created in
            the swarm when missing.
    """

    def __init__(self, spec: ServiceSpec, client: Any = None, secrets: dict[str, str] | None = None) -> None:
        self.spec = spec
        self._client = client
        self._secrets = dict(secrets or {})
        self._workers: tuple[float, int] | None = None  # (monotonic time it was counted at, running containers)

    def __repr__(self) -> str:
        return f"SwarmLauncher({self.spec.name!r}, secrets={sorted(self._secrets)})"  # names, never values

    def _secret_ids(self) -> dict[str, str]:
        """The id of each secret of the spec, creating those missing from their values.

        Raises:
            DeployError: a missing secret whose value this launcher does not have.
        """
        ids: dict[str, str] = {}
        for secret in self.spec.secrets:
            found = [s for s in self.client.secrets.list(filters={"name": secret.name}) if s.name == secret.name]
            if found:
                ids[secret.name] = found[0].id
            elif secret.name in self._secrets:
                created = self.client.secrets.create(name=secret.name, data=self._secrets[secret.name].encode(),
                                                     labels={LABEL_MANAGED: "true"})
                ids[secret.name] = created.id
            else:
                raise DeployError(f"docker secret {secret.name} ({secret.variable}) is missing and its value "
                                  "unknown here")
        return ids

    @property
    def client(self) -> Any:
        """The docker client.

        Raises:
            DeployError: the docker SDK is missing or the engine cannot be reached.
        """
        if self._client is None:
            self._client = engine_client()
        return self._client

    def _find(self) -> Any | None:
        """The service of this name, or ``None``."""
        errors = docker_sdk().errors
        try:
            return self.client.services.get(self.spec.name)
        except errors.NotFound:
            return None

    def start(self, workers: int) -> None:
        """Create the service with ``workers`` replicas.

        A service of the same name left by an earlier session of this experiment (a manager that died before
        removing it) is replaced; one of this session is scaled; one not created by labswarm is left alone.

        Raises:
            DeployError: the engine refused or could not be reached, or a foreign service has the name.
            ValueError: ``workers`` < 0.
        """
        spec = self.spec.with_replicas(workers)
        self._workers = None
        with translate_errors(f"create service {spec.name}"):
            existing = self._find()
            if existing is not None:
                labels = service_labels(existing)
                if labels.get(LABEL_MANAGED) != "true":
                    raise DeployError(f"a service named {spec.name} exists and was not created by labswarm; "
                                      "remove it (docker service rm) or rename the experiment")
                if labels.get(LABEL_SESSION) == spec.session:
                    existing.scale(workers)
                    self.spec = spec
                    return
                existing.remove()
            self.client.services.create(**spec.to_docker(self._secret_ids()))
        self.spec = spec

    def scale(self, workers: int) -> None:
        """Run ``workers`` replicas from now on (the swarm starts or stops containers).

        Raises:
            DeployError: the service does not exist (removed by hand?), or the engine refused.
            ValueError: ``workers`` < 0.
        """
        spec = self.spec.with_replicas(workers)
        self._workers = None
        with translate_errors(f"scale service {spec.name} to {workers}"):
            service = self._find()
            if service is None or service_labels(service).get(LABEL_SESSION) != spec.session:
                raise DeployError(f"service {spec.name} of session {spec.session} does not exist "
                                  "(removed by hand?); start a new session")
            service.scale(workers)
        self.spec = spec

    def stop(self, timeout: float = 30.0) -> None:
        """Remove the service: each container gets SIGTERM, then SIGKILL after the spec's ``stop_grace_s``.

        A service already gone, or one that belongs to another session, is left as it is.

        Args:
            timeout: unused: the grace period is part of the service (``stop_grace_s``).

        Raises:
            DeployError: the engine refused or could not be reached.
        """
        self._workers = None
        with translate_errors(f"remove service {self.spec.name}"):
            service = self._find()
            if service is not None and service_labels(service).get(LABEL_SESSION) == self.spec.session:
                service.remove()

    @property
    def workers(self) -> int:
        """Containers of the service in state ``running`` (0 when the service does not exist), as counted at most
        :data:`WORKERS_TTL` seconds ago (since the last start, scale or stop); an error is not kept.

        Raises:
            DeployError: the engine refused or could not be reached.
        """
        if self._workers is not None and time.monotonic() - self._workers[0] < WORKERS_TTL:
            return self._workers[1]
        counted_at = time.monotonic()
        with translate_errors(f"list the tasks of service {self.spec.name}"):
            service = self._find()
            tasks = [] if service is None else service.tasks(filters={"desired-state": "running"})
        running = sum(task.get("Status", {}).get("State") == "running" for task in tasks)
        self._workers = (counted_at, running)
        return running
