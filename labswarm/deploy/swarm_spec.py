"""The plain data of a docker swarm service and the few helpers that talk to the Docker engine, shared by the
sessions' worker services (:mod:`labswarm.deploy.swarm`) and the training jobs' learner services
(:mod:`labswarm.deploy.swarm_learners`).

:class:`ServiceSpec` is what the manager asks the engine for, testable without an engine;
:meth:`ServiceSpec.to_docker` turns it into the keyword arguments of ``DockerClient.services.create``.
:func:`translate_errors` turns every error of the engine or of the connection to it into a
:class:`~labswarm.errors.DeployError`; :func:`docker_sdk` imports the SDK (PyPI ``docker``, the ``swarm`` extra).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from labswarm.deploy.swarm_secrets import SecretSpec
from labswarm.errors import DeployError

#: Prefix of the worker services' names: ``labswarm-<experiment>``.
SERVICE_PREFIX = "labswarm-"
#: Longest service name the engine accepts (a DNS label).
MAX_NAME = 63
#: Labels of a service the launcher created (and LABEL_MANAGED): a service without LABEL_MANAGED is never touched.
LABEL_EXPERIMENT = "labswarm.experiment"
LABEL_SESSION = "labswarm.session"
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
        docker = docker_sdk()
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


def service_labels(service: Any) -> dict[str, str]:
    """The labels of a service (a ``docker.models.services.Service``); ``{}`` when it has none."""
    return (service.attrs.get("Spec") or {}).get("Labels") or {}


def docker_sdk() -> Any:
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
def translate_errors(action: str) -> Iterator[None]:
    """Turn the docker SDK's errors (and those of its HTTP transport) into :class:`DeployError`."""
    docker = docker_sdk()
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



def engine_client() -> Any:
    """A ``docker.DockerClient`` from the environment (``DOCKER_HOST`` or ``/var/run/docker.sock``).

    Raises:
        DeployError: the docker SDK is missing or the engine cannot be reached.
    """
    docker = docker_sdk()
    with translate_errors("connect to the Docker engine (DOCKER_HOST or /var/run/docker.sock)"):
        return docker.from_env()
