"""Workers as a docker swarm service: one replicated service per experiment session, created, scaled and
removed by the manager through the Docker engine API (PyPI ``docker``, the ``swarm`` extra).

The service specification is plain data (:class:`ServiceSpec`, built by :func:`service_spec` from the
settings), so what the manager asks the engine for is testable without an engine; :meth:`ServiceSpec.to_docker`
turns it into the keyword arguments of ``DockerClient.services.create``. Every error of the engine or of the
connection to it becomes a :class:`~labswarm.errors.DeployError` naming the service.

Secrets (the API token, a broker URL with a password) never travel in the service's ``Env`` or command line,
which ``docker service inspect`` shows: the launcher stores each as a docker secret (:func:`secret_values`) and
the containers read it from ``/run/secrets/...`` through ``LABSWARM_<NAME>_FILE`` (see :mod:`labswarm.settings`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from labswarm.deploy.base import Launcher
from labswarm.deploy.swarm_secrets import LABEL_MANAGED, SecretSpec, worker_secrets
from labswarm.errors import DeployError
from labswarm.redact import has_password

if TYPE_CHECKING:
    from labswarm.settings import Settings

#: Prefix of the worker services' names: ``labswarm-<experiment>``.
SERVICE_PREFIX = "labswarm-"
#: Longest service name the engine accepts (a DNS label).
MAX_NAME = 63
#: Labels of a service the launcher created (and LABEL_MANAGED): a service without LABEL_MANAGED is never touched.
LABEL_EXPERIMENT = "labswarm.experiment"
LABEL_SESSION = "labswarm.session"
#: Environment of every worker container: one maths thread per pool process (see the runbook).
WORKER_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
INSTALL_HINT = "the swarm launcher needs the docker SDK: pip install 'labswarm[swarm]'"


def service_name(experiment: str) -> str:
    """The swarm service name of an experiment's workers: ``labswarm-<experiment>``.

    Experiment names may hold ``.`` and end with ``.``, ``_`` or ``-``, which a service name may not (swarm
    wants a DNS name component: letters and digits, inner ``-`` and ``_``, at most 63 characters); such a
    name, or a too long one, is rewritten and suffixed with 8 hex digits of its hash so that two experiments
    never share a service.
    """
    wanted = SERVICE_PREFIX + experiment
    clean = re.sub(r"[^a-z0-9_-]", "-", wanted.lower()).strip("-_")
    if clean == wanted and len(clean) <= MAX_NAME:
        return clean
    digest = hashlib.blake2b(experiment.encode(), digest_size=4).hexdigest()
    return f"{clean[: MAX_NAME - len(digest) - 1].rstrip('-_')}-{digest}"


@dataclass(frozen=True)
class MountSpec:
    """One mount of the worker containers.

    Attributes:
        source: a volume name (``type="volume"``) or a host path (``type="bind"``).
        target: the path inside the container.
        type: ``volume`` or ``bind``.
        driver_options: options of the ``local`` volume driver (e.g. an NFS export); empty for a plain volume.
        read_only: mount read-only.
    """

    source: str
    target: str
    type: str = "volume"
    driver_options: dict[str, str] = field(default_factory=dict)
    read_only: bool = False


@dataclass(frozen=True)
class RestartSpec:
    """Restart policy of the worker containers.

    Attributes:
        condition: ``none``, ``on-failure`` or ``any``.
        delay_s: seconds between a container's exit and its restart.
        max_attempts: restarts before giving up; 0: unlimited.
    """

    condition: str = "on-failure"
    delay_s: float = 5.0
    max_attempts: int = 0


@dataclass(frozen=True)
class ResourceSpec:
    """Resources of each container of a service (what the swarm reserves on a node, and the limits).

    Attributes:
        cpus: CPUs reserved and the limit; ``None``: neither.
        memory_mb: memory reserved and the limit, MiB; ``None``: neither.
        generic: generic resources reserved, by kind (e.g. ``{"NVIDIA-GPU": 1}``: the node must advertise them
            in its ``node-generic-resources``); empty: none.
    """

    cpus: float | None = None
    memory_mb: int | None = None
    generic: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ConfigSpec:
    """A docker config (not secret: ``docker config inspect`` shows its data) mounted as the file ``target`` in
    the containers. Its data is not part of the spec.

    Attributes:
        name: the swarm config's name.
        target: the absolute path of the file in the container.
    """

    name: str
    target: str


@dataclass(frozen=True)
class ServiceSpec:
    """What the manager asks the swarm for: a replicated service of workers of one experiment session.

    Attributes:
        name: service name (:func:`service_name`).
        image: the labswarm image.
        command: the worker's full command line (it replaces the image's entrypoint).
        network: the overlay network to attach to (the stack's, where the manager and RabbitMQ are).
        replicas: worker containers.
        mounts: shared data (datasets and feature store).
        env: environment variables.
        restart: restart policy.
        labels: service labels (managed-by, experiment, session).
        constraints: placement constraints.
        stop_grace_s: seconds a container gets after SIGTERM (Celery warm shutdown) before SIGKILL.
        secrets: docker secrets mounted in the containers (their values are not here).
        configs: docker configs mounted in the containers (their data is not here).
        resources: reservations and limits of each container; ``None``: none.
    """

    name: str
    image: str
    command: tuple[str, ...]
    network: str
    replicas: int
    mounts: tuple[MountSpec, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    restart: RestartSpec = field(default_factory=RestartSpec)
    labels: dict[str, str] = field(default_factory=dict)
    constraints: tuple[str, ...] = ()
    stop_grace_s: float = 60.0
    secrets: tuple[SecretSpec, ...] = ()
    configs: tuple[ConfigSpec, ...] = ()
    resources: ResourceSpec | None = None

    @property
    def session(self) -> str | None:
        """The session the service belongs to (its ``labswarm.session`` label)."""
        return self.labels.get(LABEL_SESSION)

    def with_replicas(self, replicas: int) -> ServiceSpec:
        """The same specification with ``replicas`` workers.

        Raises:
            ValueError: ``replicas`` is negative.
        """
        if replicas < 0:
            raise ValueError(f"workers must be >= 0, got {replicas}")
        return replace(self, replicas=replicas)

    def to_docker(self, secret_ids: dict[str, str] | None = None,
                  config_ids: dict[str, str] | None = None) -> dict[str, Any]:
        """Keyword arguments of ``docker.DockerClient().services.create`` (docker SDK >= 7).

        Args:
            secret_ids: the engine's id of each secret of :attr:`secrets`, by name (:meth:`SwarmLauncher.start`
                creates them).
            config_ids: the engine's id of each config of :attr:`configs`, by name.

        Raises:
            DeployError: the docker SDK is not installed, or a secret or config has no id.
        """
        docker = _docker()
        types = docker.types
        mounts = [
            types.Mount(
                m.target, m.source, type=m.type, read_only=m.read_only,
                driver_config=types.DriverConfig("local", options=dict(m.driver_options)) if m.driver_options
                else None,
            )
            for m in self.mounts
        ]
        extra: dict[str, Any] = {}
        if self.secrets:
            ids = secret_ids or {}
            missing = [s.name for s in self.secrets if s.name not in ids]
            if missing:
                raise DeployError(f"service {self.name}: docker secrets {', '.join(missing)} do not exist")
            extra["secrets"] = [types.SecretReference(ids[s.name], s.name, filename=s.target)
                                for s in self.secrets]
        if self.configs:
            ids = config_ids or {}
            missing = [c.name for c in self.configs if c.name not in ids]
            if missing:
                raise DeployError(f"service {self.name}: docker configs {', '.join(missing)} do not exist")
            extra["configs"] = [types.ConfigReference(ids[c.name], c.name, filename=c.target) for c in self.configs]
        if self.resources is not None:
            r = self.resources
            nano_cpus = round(r.cpus * 1e9) if r.cpus else None
            memory = r.memory_mb * 2**20 if r.memory_mb else None
            extra["resources"] = types.Resources(cpu_limit=nano_cpus, mem_limit=memory, cpu_reservation=nano_cpus,
                                                 mem_reservation=memory, generic_resources=dict(r.generic) or None)
        return {
            **extra,
            "image": self.image,
            "command": list(self.command),
            "name": self.name,
            "networks": [self.network],
            "mode": types.ServiceMode("replicated", replicas=self.replicas),
            "mounts": mounts,
            "env": [f"{key}={value}" for key, value in self.env.items()],
            "restart_policy": types.RestartPolicy(condition=self.restart.condition,
                                                  delay=round(self.restart.delay_s * 1e9),
                                                  max_attempts=self.restart.max_attempts),
            "labels": dict(self.labels),
            "constraints": list(self.constraints),
            "stop_grace_period": round(self.stop_grace_s * 1e9),
            "init": True,
        }


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
            docker = _docker()
            with _translate("connect to the Docker engine (DOCKER_HOST or /var/run/docker.sock)"):
                self._client = docker.from_env()
        return self._client

    def _find(self) -> Any | None:
        """The service of this name, or ``None``."""
        errors = _docker().errors
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
        with _translate(f"create service {spec.name}"):
            existing = self._find()
            if existing is not None:
                labels = _labels(existing)
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
        with _translate(f"scale service {spec.name} to {workers}"):
            service = self._find()
            if service is None or _labels(service).get(LABEL_SESSION) != spec.session:
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
        with _translate(f"remove service {self.spec.name}"):
            service = self._find()
            if service is not None and _labels(service).get(LABEL_SESSION) == self.spec.session:
                service.remove()

    @property
    def workers(self) -> int:
        """Containers of the service in state ``running`` now (0 when the service does not exist).

        Raises:
            DeployError: the engine refused or could not be reached.
        """
        with _translate(f"list the tasks of service {self.spec.name}"):
            service = self._find()
            if service is None:
                return 0
            tasks = service.tasks(filters={"desired-state": "running"})
        return sum(task.get("Status", {}).get("State") == "running" for task in tasks)


def _labels(service: Any) -> dict[str, str]:
    return (service.attrs.get("Spec") or {}).get("Labels") or {}


def _docker() -> Any:
    """The docker SDK module.

    Raises:
        DeployError: it is not installed (with the install hint).
    """
    try:
        import docker.errors  # binds `docker` too
        import docker.types
    except ImportError as exc:
        raise DeployError(INSTALL_HINT) from exc
    return docker


@contextmanager
def _translate(action: str) -> Iterator[None]:
    """Turn the docker SDK's errors (and those of its HTTP transport) into :class:`DeployError`."""
    docker = _docker()
    import requests

    try:
        yield
    except DeployError:
        raise
    except docker.errors.APIError as exc:
        status = f" (HTTP {exc.status_code})" if exc.status_code else ""
        raise DeployError(f"the Docker engine refused to {action}{status}: {exc.explanation or exc}") from exc
    except docker.errors.DockerException as exc:
        raise DeployError(f"cannot {action}: {exc}") from exc
    except requests.exceptions.RequestException as exc:
        raise DeployError(f"cannot reach the Docker engine to {action}: {exc}") from exc


#: The launcher's helpers, shared with the training jobs' swarm learners (:mod:`labswarm.jobs.swarm_learners`):
#: the SDK module (or DeployError with the install hint), the error translation, a service's labels.
docker_sdk, translate_errors, service_labels = _docker, _translate, _labels
