"""Learners as docker swarm services (``LABSWARM_JOB_LAUNCHER=swarm``): one service per learner, created and
removed by the manager through the Docker engine API, as the sessions' workers are
(:mod:`labswarm.deploy.swarm`: the same :class:`~labswarm.deploy.swarm.ServiceSpec`, data mount, image, network,
placement constraints, and errors translated into :class:`~labswarm.errors.DeployError`).

Each learner's service (``labswarm-job-<job>-<attempt>-<rank>``) has 1 replica and restart condition ``none``:
the lifecycle's restart policy decides whether a learner runs again, never docker. It is labelled with the job,
the attempt and the rank (and ``labswarm.managed``); the row of the learner keeps the service's id, so a restarted
manager polls the same service; a labelled service of one of the manager's jobs that no running learner names
(left by a manager that died while deploying) is removed on the first pass, and services of jobs the manager does
not know, or without the labels, are never touched.

What the learner needs travels beside the service, never in its spec (``docker service inspect`` shows the
environment, command line and labels to anyone with access to the engine):

- the attempt's own token (and the ``AWS_*`` credentials of ``s3`` stores the manager holds) as a docker
  **secret** ``<service>-env``, a file of ``NAME='value'`` lines that the container's command loads into the
  learner's environment (``set -a; . /run/secrets/labswarm_learner_env``) before it execs the learner: the
  learner reads ``LABSWARM_API_TOKEN`` as a local one does;
- its spec (JSON: the resolved manifest, the stores, the checkpoint to start from; no secret) as a docker
  **config** ``<service>-spec`` mounted at :data:`SPEC_TARGET`, the learner's argument, so a learner on any node
  reads it. Its ``manager_url`` is ``swarm_manager_url``, its working folder is in the container
  (:data:`WORKDIR`), but a distributed learner's chunk record is on the shared data volume
  (:func:`chunk_record_path`): a killed container's lines stay there for its replacement, which appends to them,
  and for the manager, which stores them (:meth:`SwarmLearners.chunk_record`).

A distributed job (``learners: N``) has one service per learner (each has its own ``RANK``), created after its
parameter-server shards' services (:mod:`labswarm.deploy.swarm_shards`, through :meth:`SwarmLearners.shard_runner`).
The learner's place in the job (:data:`PUBLIC_ENV`: ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``: the
coordinator in the manager, by the manager's address on the overlay network; ``LABSWARM_PS_ADDRS``: the shards'
service names, or on the host network the manager's address and a port per shard) is in its service's
environment; any other variable the lifecycle's plan gives (a per-job parameter-server secret) goes into its docker
secret with the token.

GPUs are generic resources (:data:`GPU_RESOURCE`, ``resources.gpus`` of the manifest; the nodes advertise them in
their ``node-generic-resources`` and the NVIDIA runtime maps them to devices); ``cpus`` and ``memory_mb`` are both
reservation and limit. A task's state is the learner's: ``running`` (and the states before it) alive;
``complete``/``failed``/``shutdown`` ended with the container's exit code; ``rejected`` a deploy failure (``S105``);
``orphaned`` (its node lost) or a service that vanished: exit status unknown (``S104``). A halt is the manager's
answer to the learner's report (no signal can be sent to a service); a kill removes the service (SIGTERM, then
SIGKILL after :data:`KILL_GRACE_S`), its secret and its config.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from labswarm.deploy.learners import (
    TOKEN_ENV,
    LearnerHandle,
    LearnerLaunch,
    LearnerLauncher,
    LearnerRecord,
    LearnerStatus,
    learner_environment,
)
from labswarm.deploy.swarm import ConfigSpec, ResourceSpec, RestartSpec, ServiceSpec, data_mount, service_labels
from labswarm.deploy.swarm_jobs import (
    KILL_GRACE_S,
    LABEL_ATTEMPT,
    LABEL_JOB,
    LABEL_RANK,
    LABEL_SHARD,
    JobServices,
    learner_service_name,
    ps_service_name,
    task_status,
)
from labswarm.deploy.swarm_secrets import LABEL_MANAGED, SecretSpec
from labswarm.deploy.swarm_shards import SwarmShards, manager_view, shard_checkpoint_dir
from labswarm.deploy.swarm_spec import docker_sdk, translate_errors
from labswarm.errors import DeployError

if TYPE_CHECKING:
    from labswarm.settings import Settings

log = logging.getLogger(__name__)

#: Where the learner's spec (a docker config) is mounted in its container.
SPEC_TARGET = "/run/labswarm/learner.json"
#: The file name under ``/run/secrets`` of the learner's secret environment (the attempt's token, ``AWS_*``).
ENV_SECRET_TARGET = "labswarm_learner_env"
#: The learner's working folder in its container (checkpoint copies, its log): the container's own disk.
WORKDIR = "/tmp/labswarm-learner"
#: The generic resource kind of a GPU (a node's ``node-generic-resources``, e.g. ``NVIDIA-GPU=GPU-4b2e...``).
GPU_RESOURCE = "NVIDIA-GPU"
#: Environment variables of the manager a learner gets, in its secret (the ``s3`` stores' credentials).
FORWARDED_PREFIX = "AWS_"
#: The variables of a distributed learner's place in the job
#: (:class:`~labswarm.train.distributed.context.LearnerContext`)
#: that its service's environment shows; any other variable of ``LearnerLaunch.env`` (e.g. a per-job
#: parameter-server secret) travels in its docker secret.
PUBLIC_ENV = frozenset({"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LABSWARM_ATTEMPT", "LABSWARM_PS_ADDRS",
                        "LABSWARM_COLLECTIVE_TIMEOUT_S"})
#: The container's command: load the secret environment, then run the learner on the spec (``$0``).
COMMAND = ("sh", "-c", f"set -a && . /run/secrets/{ENV_SECRET_TARGET} && set +a && "
           'exec python -m labswarm.jobs.learner.entry "$0"', SPEC_TARGET)


def split_environment(env: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """``(public, secret)``: the variables of :data:`PUBLIC_ENV` (shown in the service's spec) and all others
    (carried by its docker secret)."""
    public = {k: v for k, v in env.items() if k in PUBLIC_ENV}
    return public, {k: v for k, v in env.items() if k not in PUBLIC_ENV}


def secret_environment(token: str, manager_env: dict[str, str] | None = None,
                       extra: dict[str, str] | None = None) -> str:
    """The learner's secret environment file: ``NAME='value'`` lines (shell-quoted) of the attempt's token,
    the manager's ``AWS_*`` variables (``manager_env``, default ``os.environ``) and ``extra`` (the secret part of
    the learner's place in the job, :func:`split_environment`)."""
    env = learner_environment(os.environ if manager_env is None else manager_env, token)
    kept = {k: v for k, v in env.items() if k == TOKEN_ENV or k.startswith(FORWARDED_PREFIX)}
    kept.update(extra or {})
    return "".join(f"{name}={shlex.quote(value)}\n" for name, value in sorted(kept.items()))


def learner_service_spec(launch: LearnerLaunch, settings: Settings) -> ServiceSpec:
    """The service of one learner, as data (see the module docstring).

    Args:
        launch: the learner (job, attempt, rank, the manifest's ``resources``).
        settings: image, network, data mount and constraints (``swarm_*``).

    Raises:
        ValueError: an invalid ``swarm_data_nfs``.
    """
    name = learner_service_name(launch.job_id, launch.attempt, launch.rank)
    resources = launch.resources or {}
    gpus = int(resources.get("gpus") or 0)
    return ServiceSpec(
        name=name,
        image=settings.swarm_image,
        command=COMMAND,
        network=settings.swarm_network,
        replicas=1,
        mounts=(data_mount(settings),),
        env={"PYTHONUNBUFFERED": "1", **split_environment(launch.env)[0]},
        restart=RestartSpec(condition="none", delay_s=0.0, max_attempts=0),
        labels=_labels(launch.job_id, launch.attempt, launch.rank),
        constraints=tuple(settings.swarm_constraints),
        stop_grace_s=KILL_GRACE_S,
        secrets=(SecretSpec(f"{name}-env", ENV_SECRET_TARGET, TOKEN_ENV),),
        configs=(ConfigSpec(f"{name}-spec", SPEC_TARGET),),
        resources=ResourceSpec(cpus=resources.get("cpus"), memory_mb=resources.get("memory_mb"),
                               generic={GPU_RESOURCE: gpus} if gpus else {}),
    )


def chunk_record_path(settings: Settings, job_id: str, attempt: int, rank: int) -> Path:
    """Where a swarm learner keeps its chunk record (:mod:`labswarm.train.distributed.record`), in its container:
    on the shared data volume, ``<swarm_data_target>/.labswarm-jobs/<job>/chunks/attempt-<n>/rank-<r>.jsonl``
    (beside the shards' checkpoints), so that a killed container's lines outlive it."""
    return shard_checkpoint_dir(settings, job_id).parent / "chunks" / f"attempt-{attempt}" / f"rank-{rank}.jsonl"


class SwarmLearners(JobServices, LearnerLauncher):
    """Learners as docker swarm services (see the module docstring). Keeps no state: everything is found from
    the learner's row (its service id) and the labels.

    Args:
        settings: the ``swarm_*`` settings (image, network, data mount, constraints, the manager's URL as the
            containers reach it).
        client: a ``docker.DockerClient``; default ``docker.from_env()`` on first use.
    """

    local_gpus = False

    def start(self, launch: LearnerLaunch) -> LearnerHandle:
        """Create the learner's secret, config and service (a stale set of the same name, of the same job, is
        replaced); a copy of its spec is written to ``launch.spec_path`` for a post-mortem.

        Raises:
            DeployError: the engine refused or could not be reached, or a foreign service, secret or config has
                the name; nothing of the learner is left behind.
        """
        spec = learner_service_spec(launch, self.settings)
        learner = dict(launch.spec, manager_url=self.settings.swarm_manager_url,
                       workdir=f"{WORKDIR}/rank-{launch.rank}",
                       chunk_log=str(chunk_record_path(self.settings, launch.job_id, launch.attempt, launch.rank)))
        data = json.dumps(learner)
        launch.spec_path.parent.mkdir(parents=True, exist_ok=True)
        launch.spec_path.write_text(data)
        with translate_errors(f"create learner service {spec.name}"):
            self._remove_stale(spec.name, launch.job_id)
            try:
                secret = self.client.secrets.create(name=spec.secrets[0].name, labels=spec.labels,
                                                    data=secret_environment(
                                                        launch.token, extra=split_environment(launch.env)[1]
                                                    ).encode())
                config = self.client.configs.create(name=spec.configs[0].name, labels=spec.labels,
                                                    data=data.encode())
                service = self.client.services.create(**spec.to_docker({secret.name: secret.id},
                                                                       {config.name: config.id}))
            except Exception:
                with contextlib.suppress(Exception):  # best effort: the original error is what matters
                    self.remove_named(spec.name, launch.job_id)
                raise
        log.info("job %s attempt %d learner %d: service %s (%s)", launch.job_id, launch.attempt, launch.rank,
                 spec.name, service.id)
        return LearnerHandle(service_id=service.id)

    def chunk_record(self, learner: LearnerRecord) -> Path:
        """The learner's chunk record on the shared volume (:func:`chunk_record_path`) as the manager sees it."""
        return manager_view(self.settings, chunk_record_path(self.settings, learner.job_id, learner.attempt,
                                                             learner.rank))

    def collect(self, job_id: str) -> None:
        """The job ended (its shards stopped first) or is deleted: remove its folder of the shared volume as the
        manager sees it (:func:`~labswarm.deploy.swarm_shards.manager_view`), its chunk records (each learner, or
        the manager, stored them) and its shards' checkpoints with it; a halted job keeps it for its resume."""
        folder = manager_view(self.settings, shard_checkpoint_dir(self.settings, job_id).parent)
        shutil.rmtree(folder, ignore_errors=True)

    def shard_runner(self, job_id: str) -> SwarmShards:
        """The runner of ``job_id``'s parameter-server shards as services (:mod:`labswarm.deploy.swarm_shards`),
        which :class:`~labswarm.jobs.lifecycle.cluster.JobCluster` uses instead of local processes.

        Raises:
            ValueError: ``swarm_manager_url`` has no host (the learners' ``MASTER_ADDR``).
        """
        return SwarmShards(self, job_id)

    def poll(self, learner: LearnerRecord) -> LearnerStatus:
        """The state of the service's task (see the module docstring); alive while the engine cannot tell."""
        if learner.service_id is None:
            return LearnerStatus(False)
        errors = docker_sdk().errors
        try:
            with translate_errors(f"read the tasks of learner service {learner.service_id}"):
                try:
                    service = self.client.services.get(learner.service_id)
                except errors.NotFound:
                    return LearnerStatus(False, reason=f"its service {learner.service_id} no longer exists")
                tasks = service.tasks()
        except DeployError as exc:
            log.warning("job %s learner %d: %s (taken as alive)", learner.job_id, learner.rank, exc)
            return LearnerStatus(True)
        return task_status(tasks)

    def terminate(self, learner: LearnerRecord) -> None:
        """Nothing: a service cannot be signalled; the manager's answer to the learner's next report (``halt``)
        asks it to halt, and :meth:`kill` removes it after the grace."""

    def kill(self, learner: LearnerRecord) -> None:
        """Remove the learner's service (its container gets SIGTERM, SIGKILL after :data:`KILL_GRACE_S`), then
        its secret and config. An engine error is logged; the lifecycle kills again while the learner lives."""
        name = learner_service_name(learner.job_id, learner.attempt, learner.rank)
        try:
            with translate_errors(f"remove learner service {name}"):
                self.remove_named(name, learner.job_id, learner.service_id)
        except DeployError as exc:
            log.warning("job %s learner %d: %s", learner.job_id, learner.rank, exc)

    def output_tail(self, learner: LearnerRecord, lines: int) -> list[str]:
        """The service's last ``lines`` log lines (the engine's logging driver must keep them: ``json-file``,
        ``local`` or ``journald``); none when it cannot give them."""
        if learner.service_id is None:
            return []
        try:
            with translate_errors(f"read the logs of learner service {learner.service_id}"):
                chunks = self.client.services.get(learner.service_id).logs(stdout=True, stderr=True, tail=lines)
                text = b"".join(chunks).decode("utf-8", errors="replace")
        except DeployError as exc:
            log.info("job %s learner %d: no raw output: %s", learner.job_id, learner.rank, exc)
            return []
        return text.splitlines()[-lines:]

    def sweep(self, live: set[str], owns: Callable[[str], bool] = lambda _job: False) -> None:
        """Adopt the learner services that ``live`` names; remove those of the manager's jobs (``owns(job_id)``)
        that no running learner names, with their secrets and configs; leave every other service alone."""
        try:
            with translate_errors("list the learner services"):
                for service in self.client.services.list(filters={"label": LABEL_JOB}):
                    labels = service_labels(service)
                    job = labels.get(LABEL_JOB)
                    if labels.get(LABEL_MANAGED) != "true" or not job or service.id in live or not owns(job):
                        continue
                    log.warning("job %s: removing learner service %s, which no running learner names", job,
                                service.id)
                    service.remove()
                for collection in (self.client.secrets, self.client.configs):
                    for item in collection.list(filters={"label": LABEL_JOB}):
                        labels = (item.attrs.get("Spec") or {}).get("Labels") or {}
                        job = labels.get(LABEL_JOB, "")
                        service = (ps_service_name(job, labels[LABEL_SHARD]) if LABEL_SHARD in labels else
                                   learner_service_name(job, labels.get(LABEL_ATTEMPT, ""), labels.get(LABEL_RANK, "")))
                        if labels.get(LABEL_MANAGED) == "true" and owns(job) and not self.exists(service):
                            item.remove()
        except DeployError as exc:
            log.warning("cannot sweep the learner services: %s", exc)

    def _remove_stale(self, name: str, job_id: str) -> None:
        """Remove a service, secret or config of this name left by a manager that died while deploying it.

        Raises:
            DeployError: one of them was not created by labswarm for this job.
        """
        self.remove_named(name, job_id, check=True)


def _labels(job_id: str, attempt: int, rank: int) -> dict[str, str]:
    return {LABEL_MANAGED: "true", LABEL_JOB: job_id, LABEL_ATTEMPT: str(attempt), LABEL_RANK: str(rank)}
